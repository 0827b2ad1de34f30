#!/usr/bin/env python3
"""Reads an exported Hugging Face model directory with nothing but the standard library and
checks it against its own config.json, independently of megaengine's reader: every tensor
LlamaForCausalLM or GPT2LMHeadModel loads is present once with the dtype config.json names and
the shape its config makes; offsets tile each file's data section exactly; the index (when
sharded) places each tensor in the file that holds it; the files carry transformers' "pt" format
tag. Usage: hf_headers.py DIR   (prints one summary line; exits 1 with the problems otherwise)."""
import json
import os
import struct
import sys

DTYPES = {"float32": ("F32", 4), "bfloat16": ("BF16", 2), "float16": ("F16", 2)}


def expected_tensors(c):
    """{name: shape} of the model config.json describes, from transformers' module layout."""
    out = {}
    if c["model_type"] == "llama":
        h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        d, f, bias = h // heads, c["intermediate_size"], c.get("attention_bias", False)
        out["model.embed_tokens.weight"] = [c["vocab_size"], h]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = [h]
            out[p + "post_attention_layernorm.weight"] = [h]
            for name, rows in (("q_proj", heads * d), ("k_proj", kv * d), ("v_proj", kv * d)):
                out[p + f"self_attn.{name}.weight"] = [rows, h]
                if bias:
                    out[p + f"self_attn.{name}.bias"] = [rows]
            out[p + "self_attn.o_proj.weight"] = [h, heads * d]
            out[p + "mlp.gate_proj.weight"] = [f, h]
            out[p + "mlp.up_proj.weight"] = [f, h]
            out[p + "mlp.down_proj.weight"] = [h, f]
            if bias:
                out.update({p + "self_attn.o_proj.bias": [h], p + "mlp.gate_proj.bias": [f],
                            p + "mlp.up_proj.bias": [f], p + "mlp.down_proj.bias": [h]})
        out["model.norm.weight"] = [h]
    elif c["model_type"] == "gpt2":
        h, f = c["n_embd"], c.get("n_inner") or 4 * c["n_embd"]
        out["transformer.wte.weight"] = [c["vocab_size"], h]
        out["transformer.wpe.weight"] = [c["n_positions"], h]
        for i in range(c["n_layer"]):
            p = f"transformer.h.{i}."
            for ln in ("ln_1", "ln_2"):
                out[p + ln + ".weight"] = [h]
                out[p + ln + ".bias"] = [h]
            out[p + "attn.c_attn.weight"] = [h, 3 * h]  # Conv1D: [in, out]
            out[p + "attn.c_attn.bias"] = [3 * h]
            out[p + "attn.c_proj.weight"] = [h, h]
            out[p + "attn.c_proj.bias"] = [h]
            out[p + "mlp.c_fc.weight"] = [h, f]
            out[p + "mlp.c_fc.bias"] = [f]
            out[p + "mlp.c_proj.weight"] = [f, h]
            out[p + "mlp.c_proj.bias"] = [h]
        out["transformer.ln_f.weight"] = [h]
        out["transformer.ln_f.bias"] = [h]
    else:
        sys.exit(f"unknown model_type {c['model_type']}")
    if not c.get("tie_word_embeddings", c["model_type"] == "gpt2"):
        out["lm_head.weight"] = [c["vocab_size"], c.get("hidden_size", c.get("n_embd"))]
    return out


def read_header(path, problems):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    if header.get("__metadata__", {}).get("format") != "pt":
        problems.append(f"{path}: __metadata__.format is not 'pt'")
    size = len(data) - 8 - n
    at = 0
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, e in sorted(entries.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        if b != at:
            problems.append(f"{path}: {name} starts at {b}, the previous tensor ended at {at}")
        at = end
    if at != size:
        problems.append(f"{path}: the tensors end at {at}, the data section has {size} bytes")
    return entries


def main(directory):
    config = json.load(open(os.path.join(directory, "config.json")))
    dtype, width = DTYPES[config["torch_dtype"]]
    want = expected_tensors(config)
    problems, seen = [], {}
    index = os.path.join(directory, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    weight_map = json.load(open(index))["weight_map"] if os.path.exists(index) else None
    total = 0
    for name in files:
        for t, e in read_header(os.path.join(directory, name), problems).items():
            if t in seen:
                problems.append(f"{t} is in {seen[t]} and {name}")
            seen[t] = name
            if weight_map is not None and weight_map.get(t) != name:
                problems.append(f"the index places {t} in {weight_map.get(t)}, it is in {name}")
            if e["dtype"] != dtype:
                problems.append(f"{t} is {e['dtype']}, config.json says {config['torch_dtype']}")
            if t in want and e["shape"] != want[t]:
                problems.append(f"{t} is {e['shape']}, config.json makes it {want[t]}")
            count = 1
            for s in e["shape"]:
                count *= s
            if e["data_offsets"][1] - e["data_offsets"][0] != count * width:
                problems.append(f"{t}: its byte range does not hold {e['shape']} of {dtype}")
            total += count * width
    for t in sorted(set(want) - set(seen)):
        problems.append(f"missing {t}")
    for t in sorted(set(seen) - set(want)):
        problems.append(f"unexpected {t}")
    if problems:
        print("hf_headers: FAILED\n  " + "\n  ".join(problems))
        sys.exit(1)
    print(f"hf_headers: {len(seen)} tensors in {len(files)} file(s), {dtype}, {total} bytes, "
          f"names, shapes and offsets as config.json ({config['model_type']}) makes them")


if __name__ == "__main__":
    main(sys.argv[1])
