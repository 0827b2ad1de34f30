#!/usr/bin/env python3
"""Where tensor parallelism's extra time goes: one GPU's compute stream in two step-profiler traces
(e.g. tp 1 and one rank of tp 2, the same model and steps), kernel time by kind side by side.

A rank at tp t should spend 1/t of tp 1's time on each kind of kernel; the last column is what it
spends beyond that (B - A x tp_a / tp_b), so the layer's lost efficiency reads as a list: the
collectives' own kernels (barriers, sums, copies), the small kernels that only tp > 1 runs, GEMMs
slower or faster in chunks, and the stream's idle time (gaps of up to 10 us between kernels,
mostly launch latency, and longer ones, mostly waits). The compute stream is the stream with the
most kernel time. Both traces come from `train.profile_trace` (bench/speed/tp_width.sh keeps them
with ME_BENCH_KEEP_TRACES=all).

    python3 bench/speed/trace_compare.py TP1.json TP2.json [--tp-a 1] [--tp-b 2] [--top 30]

Standard library only.
"""
import argparse
import collections
import json
import re
import sys

GPU = ("kernel", "gpu_memcpy", "gpu_memset")
# (kind, substrings of the kernel's name), first match wins
KINDS = [
    ("GEMM", ("nvjet", "xmma_gemm", "cutlass", "gemm_kernel", "sm90_gemm", "ampere_bf16", "cublas")),
    ("attention", ("sdpa", "flash", "cudnn", "fmha")),
    ("NCCL", ("nccl",)),
    ("copy-engine barrier", ("barrier_kernel",)),
    ("reduce-scatter sum", ("sum_parts",)),
    ("memcpy", ("Memcpy",)),
    ("memset", ("Memset",)),
]


def kind(name):
    for label, keys in KINDS:
        if any(k in name for k in keys):
            return label
    # else the kernel's own name: no "void ", template arguments, parameters or namespaces
    short = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "")
    short = re.split(r"[<(]", short)[0]
    return short.split("::")[-1] or name[:40]


def compute_stream(path):
    """(kernel time by kind, calls by kind, span us, short gaps us, long gaps us) of the compute stream."""
    events = json.load(open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    gpu = [e for e in events if e.get("cat") in GPU and "dur" in e]
    if not gpu:
        sys.exit(f"{path}: no GPU kernels (was the profile taken on a GPU?)")
    per_stream = collections.Counter()
    for e in gpu:
        per_stream[(e.get("pid"), e.get("tid"))] += e["dur"]
    stream = per_stream.most_common(1)[0][0]
    mine = sorted((e for e in gpu if (e.get("pid"), e.get("tid")) == stream), key=lambda e: e["ts"])
    time, calls = collections.Counter(), collections.Counter()
    short = long = 0.0
    end = None
    for e in mine:
        k = kind(e["name"])
        time[k] += e["dur"]
        calls[k] += 1
        if end is not None and e["ts"] > end:
            gap = e["ts"] - end
            if gap <= 10:
                short += gap
            else:
                long += gap
        end = max(end or e["ts"], e["ts"] + e["dur"])
    span = end - mine[0]["ts"]
    return time, calls, span, short, long


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tp-a", type=int, default=1)
    p.add_argument("--tp-b", type=int, default=2)
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    ta, ca, span_a, short_a, long_a = compute_stream(args.a)
    tb, cb, span_b, short_b, long_b = compute_stream(args.b)
    scale = args.tp_a / args.tp_b
    rows = [(k, ta.get(k, 0.0), ca.get(k, 0), tb.get(k, 0.0), cb.get(k, 0)) for k in set(ta) | set(tb)]
    rows.sort(key=lambda r: -abs(r[3] - r[1] * scale))
    print(f"compute stream, ms (calls) | A: tp {args.tp_a} | B: tp {args.tp_b} | B beyond A x {scale:g}")
    print("---|--:|--:|--:")
    for k, a, na, b, nb in rows[: args.top]:
        print(f"{k} | {a / 1e3:.2f} ({na}) | {b / 1e3:.2f} ({nb}) | {(b - a * scale) / 1e3:+.2f}")
    if len(rows) > args.top:
        rest_a = sum(r[1] for r in rows[args.top:])
        rest_b = sum(r[3] for r in rows[args.top:])
        print(f"{len(rows) - args.top} other kinds | {rest_a / 1e3:.2f} | {rest_b / 1e3:.2f} | {(rest_b - rest_a * scale) / 1e3:+.2f}")
    print(f"idle, gaps up to 10 us | {short_a / 1e3:.2f} | {short_b / 1e3:.2f} | {(short_b - short_a * scale) / 1e3:+.2f}")
    print(f"idle, longer gaps | {long_a / 1e3:.2f} | {long_b / 1e3:.2f} | {(long_b - long_a * scale) / 1e3:+.2f}")
    print(f"span (first kernel to last) | {span_a / 1e3:.2f} | {span_b / 1e3:.2f} | {(span_b - span_a * scale) / 1e3:+.2f}")


if __name__ == "__main__":
    main()
