#!/usr/bin/env python3
"""The bf16 matmul peak of this GPU, measured with torch.matmul: the denominator of MFU.

Square bf16 matmuls (8192^3 and 16384^3 by default), warmed up, then timed with CUDA events
over --iters iterations, --trials times each; the best TFLOP/s over all sizes and trials is
the peak.

  python3 bench/reference/matmul_peak.py [--json results.jsonl] [--sizes 8192,16384] [--iters 50]
"""

import argparse
import json
import sys

import torch


def measure(n, iters, trials, warmup):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(warmup):
        torch.matmul(a, b, out=out)
    torch.cuda.synchronize()
    best = 0.0
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            torch.matmul(a, b, out=out)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000.0
        best = max(best, 2.0 * n ** 3 * iters / seconds / 1e12)
    del a, b, out
    torch.cuda.empty_cache()
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="8192,16384", help="comma-separated square sizes n (n x n x n)")
    p.add_argument("--iters", type=int, default=50, help="timed iterations per trial")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--json", default=None, help="append {what, tflops, device, ...} to this file")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    # Plain bf16 GEMMs; allow_bf16_reduced_precision_reduction is left at torch's default.
    name = torch.cuda.get_device_name(0)
    results = {}
    for n in (int(s) for s in args.sizes.split(",") if s.strip()):
        try:
            results[n] = measure(n, args.iters, args.trials, args.warmup)
        except torch.cuda.OutOfMemoryError:
            print(f"{n}x{n}x{n}: out of memory, skipped", flush=True)
            torch.cuda.empty_cache()
            continue
        print(f"bf16 matmul {n}x{n}x{n}: {results[n]:.1f} TFLOP/s (best of {args.trials} x {args.iters})",
              flush=True)
    if not results:
        raise SystemExit("no size could be measured")
    best_n = max(results, key=results.get)
    peak = results[best_n]
    print(f"bf16 matmul peak: {peak:.1f} TFLOP/s ({best_n}^3, {name}, torch {torch.__version__})", flush=True)
    if args.json:
        row = {"what": "matmul_peak", "tflops": peak, "device": name, "size": best_n,
               "by_size": {str(n): t for n, t in results.items()}, "torch": torch.__version__}
        with open(args.json, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
