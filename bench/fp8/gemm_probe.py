#!/usr/bin/env python3
"""fp8 against bf16 for the GEMMs of a transformer layer, on this GPU, before fp8 training exists.

    python3 bench/fp8/gemm_probe.py [--json OUT.jsonl]

For each width (GPT 1.3B, the GPT-39B and LLaMA-2-70B widths at tp 1 and tp 4) and each linear
layer of a block, times forward (x W^T), dgrad (dy W) and wgrad (dy^T x) in bf16 (torch.matmul)
and in fp8 (torch._scaled_mm: E4M3 inputs, E5M2 gradients, per-tensor scales, bf16 out), and
what fp8 costs besides the GEMM: the per-tensor amax and cast of the activation and of the
gradient, and the transposed copies that _scaled_mm's layouts need for dgrad and wgrad (weights
are cast once per step, so their cast is counted once per 'micro-batches' GEMMs, here 1).
Prints one row per layer and a layer total: the fp8/bf16 speed ratio of the GEMMs alone and with
the casts, the upper bound that per-tensor current scaling with unfused casts can reach.
"""
import argparse
import json

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def timed(fn, iters=20, warmup=5):
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def to_fp8(t, dtype):
    amax = t.abs().max().float()
    scale = torch.finfo(dtype).max / torch.clamp(amax, min=1e-12)
    return (t.float() * scale).to(dtype), scale.reciprocal()


def col_major(t):  # _scaled_mm's second operand must be column-major
    return t.t().contiguous().t()


def layer_row(name, tokens, k_in, n_out):
    x = torch.randn(tokens, k_in, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n_out, k_in, device="cuda", dtype=torch.bfloat16) * 0.02
    dy = torch.randn(tokens, n_out, device="cuda", dtype=torch.bfloat16) * 0.01
    bf16 = {"fwd": timed(lambda: x @ w.t()), "dgrad": timed(lambda: dy @ w), "wgrad": timed(lambda: dy.t() @ x)}
    x8, sx = to_fp8(x, E4M3)
    w8, sw = to_fp8(w, E4M3)
    dy8, sdy = to_fp8(dy, E5M2)
    w8_dgrad = col_major(w8)        # dgrad: dy8 [t,n] @ w8 [n,k] column-major
    dy8_t = dy8.t().contiguous()    # wgrad: dy8^T [n,t] row-major @ x8 [t,k] column-major
    x8_cm = col_major(x8)
    mm = torch._scaled_mm
    fp8 = {
        "fwd": timed(lambda: mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)),
        "dgrad": timed(lambda: mm(dy8, w8_dgrad, scale_a=sdy, scale_b=sw, out_dtype=torch.bfloat16)),
        "wgrad": timed(lambda: mm(dy8_t, x8_cm, scale_a=sdy, scale_b=sx, out_dtype=torch.bfloat16)),
    }
    casts = {
        "x": timed(lambda: to_fp8(x, E4M3)), "dy": timed(lambda: to_fp8(dy, E5M2)), "w": timed(lambda: to_fp8(w, E4M3)),
        "transposes": timed(lambda: (dy8.t().contiguous(), col_major(x8), col_major(w8))),
    }
    flops = 2.0 * tokens * k_in * n_out
    row = {"layer": name, "tokens": tokens, "in": k_in, "out": n_out,
           "bf16_ms": sum(bf16.values()), "fp8_gemm_ms": sum(fp8.values()), "cast_ms": sum(casts.values()),
           "bf16_tflops": 3 * flops / sum(bf16.values()) / 1e9, "fp8_tflops": 3 * flops / sum(fp8.values()) / 1e9}
    # sanity: fp8's forward close to bf16's
    ref = (x @ w.t()).float()
    got = mm(x8, w8.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16).float()
    row["fwd_rel_err"] = ((got - ref).norm() / ref.norm()).item()
    return row


WIDTHS = {  # name: (tokens per micro-batch, [(layer, in, out)]) at tp 1; tp divides the split dim
    "gpt1.3b": (4 * 2048, [("qkv", 2048, 6144), ("proj", 2048, 2048), ("fc1", 2048, 8192), ("fc2", 8192, 2048)]),
    "gpt39b": (2048, [("qkv", 8192, 24576), ("proj", 8192, 8192), ("fc1", 8192, 32768), ("fc2", 32768, 8192)]),
    "llama2_70b": (4096, [("qkv", 8192, 10240), ("proj", 8192, 8192), ("gate_up", 8192, 57344), ("down", 28672, 8192)]),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    out = open(args.json, "w") if args.json else None
    for width, (tokens, layers) in WIDTHS.items():
        for tp in ([1] if width == "gpt1.3b" else [1, 4]):
            tot = {"bf16_ms": 0.0, "fp8_gemm_ms": 0.0, "cast_ms": 0.0}
            for name, k_in, n_out in layers:
                # column layers (qkv, fc1, gate_up) split their output, row layers their input
                column = name in ("qkv", "fc1", "gate_up")
                r = layer_row(name, tokens, k_in if column else k_in // tp, n_out // tp if column else n_out)
                r.update(width=width, tp=tp)
                for k in tot:
                    tot[k] += r[k]
                print(f"{width:10s} tp{tp} {name:8s} t={tokens} {r['in']}->{r['out']}: bf16 {r['bf16_ms']:.3f} ms "
                      f"({r['bf16_tflops']:.0f} TF/s), fp8 GEMMs {r['fp8_gemm_ms']:.3f} ms ({r['fp8_tflops']:.0f} TF/s), "
                      f"casts {r['cast_ms']:.3f} ms, fwd rel err {r['fwd_rel_err']:.4f}")
                if out:
                    out.write(json.dumps(r) + "\n")
            print(f"{width:10s} tp{tp} layer GEMMs: bf16 {tot['bf16_ms']:.3f} ms, fp8 {tot['fp8_gemm_ms']:.3f} ms "
                  f"(x{tot['bf16_ms'] / tot['fp8_gemm_ms']:.2f}), fp8 + unfused casts "
                  f"{tot['fp8_gemm_ms'] + tot['cast_ms']:.3f} ms (x{tot['bf16_ms'] / (tot['fp8_gemm_ms'] + tot['cast_ms']):.2f})")


if __name__ == "__main__":
    main()
