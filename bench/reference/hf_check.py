#!/usr/bin/env python3
"""megaengine against Hugging Face transformers itself (bench/reference/hf_check.sh runs it).

  prepare --out OUT      token ids (OUT/tokens_small.txt for the trained models, OUT/tokens_import.txt
                         for the imported one) and a text file to train on (OUT/text.txt)
  make-llama --out DIR   a randomly initialised LlamaForCausalLM (hidden 512, 8 heads, 2 key/value
                         heads, 4 layers, vocab 32000; its norm weights drawn too) saved with
                         save_pretrained (safetensors)
  compare --out OUT      (a) each OUT/<model>-<precision>/hf that megaengine exported, loaded with
                         AutoModelForCausalLM.from_pretrained: its logits on the same ids against the
                         logits megaengine wrote (OUT/<model>-<precision>/megaengine.safetensors);
                         (b) the random model's logits, loss on the fixed batch and the gradient norm
                         of that loss against megaengine's after importing it (OUT/import/...).
                         Prints one line per check and OUT/hf_check.json; exits 1 if one fails.

Needs torch, transformers and safetensors; no network.
"""
import argparse
import json
import os
import random
import sys

torch = None  # imported by the steps that need it (prepare runs without torch)


def need_torch():
    global torch
    import torch as t
    torch = t
    # transformers' side in true fp32: no TF32 matmuls (megaengine uses none either).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

FP32_TOL = 1e-4   # relative: max |megaengine - transformers| / max |transformers|
BF16_TOL = 3e-2   # bf16 carries 8 significant bits; two engines round at different places
VOCAB_SMALL, SEQ_SMALL = 256, 64
SEQ_IMPORT = 128  # megaengine's model.seq there; the batch holds one more token (the last label)
LLAMA = dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
             rms_norm_eps=1e-5, tie_word_embeddings=False)  # rope_theta: LlamaConfig's default, 10000


def write_ids(path, ids):
    with open(path, "w") as f:
        f.write(f"{len(ids)} {len(ids[0])}\n")
        for row in ids:
            f.write(" ".join(str(i) for i in row) + "\n")


def read_ids(path):
    with open(path) as f:
        b, s = (int(x) for x in f.readline().split())
        ids = [[int(x) for x in f.readline().split()] for _ in range(b)]
    assert all(len(r) == s for r in ids)
    return torch.tensor(ids, dtype=torch.long)


def prepare(out):
    os.makedirs(out, exist_ok=True)
    rng = random.Random(1234)
    write_ids(os.path.join(out, "tokens_small.txt"), [[rng.randrange(VOCAB_SMALL) for _ in range(SEQ_SMALL)] for _ in range(2)])
    write_ids(os.path.join(out, "tokens_import.txt"),
              [[rng.randrange(LLAMA["vocab_size"]) for _ in range(SEQ_IMPORT + 1)] for _ in range(2)])
    words = ["whale", "sea", "ship", "the", "of", "and", "Ahab", "a", "to", "in", "captain", "white", "harpoon"]
    with open(os.path.join(out, "text.txt"), "w") as f:
        f.write(" ".join(rng.choice(words) for _ in range(60000)))


def make_llama(out):
    need_torch()
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA)).float()
    with torch.no_grad():  # norm weights away from 1, so that a misplaced one shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)
    model.save_pretrained(out)  # safetensors: the default since transformers 4.35
    if not any(os.path.exists(os.path.join(out, f)) for f in ("model.safetensors", "model.safetensors.index.json")):
        raise SystemExit(f"hf_check: save_pretrained wrote no safetensors into {out}: {sorted(os.listdir(out))}")
    print(f"hf_check: saved a random LlamaForCausalLM ({sum(p.numel() for p in model.parameters())} parameters) to {out}")


def load(directory, dtype, device):
    """AutoModelForCausalLM.from_pretrained, with nothing missing or left over, then cast to
    `dtype` (the files hold that dtype already, so the cast is exact; no dtype argument, whose
    name differs between transformers 4 and 5)."""
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True,
                                                       attn_implementation="eager")
    model = model.to(dtype)
    def keys(name):  # a dict in transformers 4; read as attribute too, should a version change it
        v = info.get(name) if isinstance(info, dict) else getattr(info, name, None)
        return [str(k) for k in (v or [])]
    # Buffers some versions list, and a tied head (not in the files by design).
    skip = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")
    if getattr(model.config, "tie_word_embeddings", False):
        skip += ("lm_head.weight",)
    problems = {"missing": [k for k in keys("missing_keys") if not k.endswith(skip)],
                "unexpected": keys("unexpected_keys"), "mismatched": keys("mismatched_keys")}
    bad = {k: v for k, v in problems.items() if v}
    if bad:
        raise SystemExit(f"hf_check: {directory} does not load cleanly into {type(model).__name__}: {bad}")
    return model.to(device).eval()


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def compare_trained(out, name, device, results):
    from safetensors.torch import load_file
    model_kind, precision = name.split("-")
    d = os.path.join(out, name)
    ours = load_file(os.path.join(d, "megaengine.safetensors"))["logits"]
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    model = load(os.path.join(d, "hf"), dtype, device)
    tokens = read_ids(os.path.join(out, "tokens_small.txt")).to(device)
    with torch.no_grad():
        theirs = model(input_ids=tokens).logits.float().cpu()
    e = rel(ours, theirs)
    tol = FP32_TOL if precision == "fp32" else BF16_TOL
    results.append({"check": f"export {model_kind} {precision}", "class": type(model).__name__,
                    "logits_rel_error": e, "tolerance": tol, "ok": e <= tol})


def compare_import(out, device, results):
    from safetensors.torch import load_file
    ours = load_file(os.path.join(out, "import", "megaengine.safetensors"))
    model = load(os.path.join(out, "hf_random"), torch.float32, device)
    tokens = read_ids(os.path.join(out, "tokens_import.txt")).to(device)
    out_ = model(input_ids=tokens, labels=tokens)  # transformers shifts: predicts tokens[:, 1:]
    logits = out_.logits[:, :-1].detach().float().cpu()  # positions 0..S-2, what megaengine saw
    out_.loss.backward()
    sq = sum(p.grad.double().pow(2).sum() for p in model.parameters() if p.grad is not None)
    checks = [("import llama logits", rel(ours["logits"], logits)),
              ("import llama loss", abs(ours["loss"].item() - out_.loss.item()) / abs(out_.loss.item())),
              ("import llama gradient norm", abs(ours["grad_norm"].item() - sq.sqrt().item()) / sq.sqrt().item())]
    for check, e in checks:
        results.append({"check": check, "class": type(model).__name__, "logits_rel_error": e, "tolerance": FP32_TOL,
                        "ok": e <= FP32_TOL})
    results[-2]["values"] = {"megaengine": ours["loss"].item(), "transformers": out_.loss.item()}
    results[-1]["values"] = {"megaengine": ours["grad_norm"].item(), "transformers": sq.sqrt().item()}


def guarded(name, fn, results, *args):
    """Runs one comparison; an exception (megaengine's file missing because its step failed, a
    model that does not load) becomes a failed row naming it instead of stopping the others."""
    try:
        fn(*args, results)
    except BaseException as e:  # SystemExit from load() too
        results.append({"check": name, "class": "-", "error": f"{type(e).__name__}: {e}",
                        "logits_rel_error": float("nan"), "tolerance": float("nan"), "ok": False})


def print_table(results):
    rows = [("CHECK", "CLASS", "REL. ERROR", "TOLERANCE", "VALUES (megaengine vs transformers)", "RESULT")]
    for r in results:
        values = f"{r['values']['megaengine']:.6f} vs {r['values']['transformers']:.6f}" if "values" in r else ""
        if "error" in r:
            values = r["error"][:200]
        rows.append((r["check"], r["class"], f"{r['logits_rel_error']:.2e}", f"{r['tolerance']:.0e}", values,
                     "PASS" if r["ok"] else "FAIL"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for k, row in enumerate(rows):
        print("hf_check | " + " | ".join(c.ljust(w) for c, w in zip(row, widths)))
        if k == 0:
            print("hf_check | " + " | ".join("-" * w for w in widths))


def compare(out):
    need_torch()
    import transformers
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = []
    for name in ("gpt-fp32", "llama-fp32", "gpt-bf16", "llama-bf16"):
        kind, precision = name.split("-")
        guarded(f"export {kind} {precision}", compare_trained, results, out, name, device)
    guarded("import llama", compare_import, results, out, device)
    print_table(results)
    summary = {"transformers": transformers.__version__, "torch": torch.__version__, "device":
               torch.cuda.get_device_name() if device == "cuda" else "cpu", "results": results}
    with open(os.path.join(out, "hf_check.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"hf_check: transformers {transformers.__version__}, torch {torch.__version__}, {summary['device']}")
    failed = [r["check"] for r in results if not r["ok"]]
    if failed:
        print("hf_check: FAIL: " + ", ".join(failed))
        sys.exit(1)
    print(f"hf_check: PASS: all {len(results)} checks")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["prepare", "make-llama", "compare"])
    p.add_argument("--out", required=True)
    a = p.parse_args()
    {"prepare": prepare, "make-llama": make_llama, "compare": compare}[a.what](a.out)


if __name__ == "__main__":
    main()
