#!/usr/bin/env python3
"""Which rank the others wait for: per-rank host and GPU figures from the step profiler's traces.

A multi-GPU step runs at the pace of its slowest rank; the others show that rank's lateness as
time in collectives and in the copy engines' barrier kernel, which a single rank's profile calls
communication. Given every rank's Chrome trace of the same steps (`train.profile_trace=T.json`
writes T.json for rank 0 and T.rankN.json for the others), this prints for each rank:

  - how long its kernels wait after their launch call (median, p10): a few microseconds means
    the GPU waits for the host (host-bound), milliseconds that the host runs ahead;
  - its GPU's busy time, and the part of it spent in wait kernels (NCCL, barrier_kernel);
  - the time no kernel ran (the multiprocessors idle), split by why: the next kernel's launch call
    had not returned when the last one ended (host late), or it was queued and a copy ran
    meanwhile (waiting for copies, e.g. the copy engines' pulls), or neither (other: a wait on
    an event, launch latency);
  - its host threads' busy time (LibTorch ops and CUDA runtime calls), synchronisations apart;
  - the median host cost of a few common calls (aten::mm, cudaLaunchKernel, cudaMemcpyAsync);
and, over the barrier kernels that every rank runs in the same order, which rank arrives last.

    python3 bench/speed/trace_ranks.py T.json [T.rank1.json ...]    (default: T.rank*.json beside T.json)

With --timeline FROM_MS LENGTH_MS it prints instead one trace's GPU events in that window (from
its first GPU event): start and duration in microseconds, stream, kind and name, to read where a
layer waits (e.g. which pull a GEMM waits for, a barrier's length):

    python3 bench/speed/trace_ranks.py --timeline 35.0 1.5 T.rank1.json

Standard library only: it runs wherever the traces are copied.
"""
import collections
import glob
import json
import os
import statistics
import sys

WAIT_KERNELS = ("barrier_kernel", "ncclDevKernel", "ncclKernel")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
HOST_CALLS = ("aten::mm", "cudaLaunchKernel", "cudaMemcpyAsync")
GPU_EVENTS = {"kernel": "kernel", "gpu_memcpy": "copy", "gpu_memset": "set"}  # trace category: kind


def union(spans):
    """The union of [start, end) spans, as disjoint [start, end] lists in order."""
    merged = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def covered(spans):
    """Time covered by the union of [start, end) spans."""
    return sum(e - s for s, e in union(spans))


def sm_idle(kernels, copies, launches):
    """Time (us) with no kernel running, split: host late, beside copies, other."""
    merged = union((e["ts"], e["ts"] + e["dur"]) for e in copies)
    late = beside = other = 0.0
    end = None
    for e in sorted(kernels, key=lambda e: e["ts"]):
        if end is not None and e["ts"] > end:  # a gap [end, e["ts"]) that kernel e ends
            gap0, gap1 = end, e["ts"]
            launch = launches.get(e.get("args", {}).get("correlation"))
            if launch is not None and launch["ts"] + launch["dur"] > gap0:
                late += gap1 - gap0
            else:
                c = sum(max(0.0, min(gap1, b) - max(gap0, a)) for a, b in merged)
                beside += c
                other += gap1 - gap0 - c
        end = e["ts"] + e["dur"] if end is None else max(end, e["ts"] + e["dur"])
    return late, beside, other


def rank_figures(path):
    events = json.load(open(path))["traceEvents"]
    x = [e for e in events if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in x if e.get("cat") in GPU_EVENTS]
    kernels = [e for e in x if e.get("cat") == "kernel"]
    runtime = [e for e in x if e.get("cat") == "cuda_runtime"]
    host = [e for e in x if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver")]
    if not kernels or not host:
        raise SystemExit(f"{path}: no GPU kernels or host events; was it written by train.profile_trace on a GPU?")
    # Launch calls: the runtime's, and the driver's (cuBLAS launches through cuLaunchKernelEx).
    launches = {e["args"]["correlation"]: e for e in x
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    idle = sm_idle(kernels, [e for e in gpu if e.get("cat") != "kernel"], launches)
    lags = sorted(e["ts"] - launches[c]["ts"] for e in kernels
                  if (c := e.get("args", {}).get("correlation")) in launches)
    threads = collections.defaultdict(list)
    for e in host:
        threads[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    calls = collections.defaultdict(list)
    for e in host:
        if e["name"] in HOST_CALLS:
            calls[e["name"]].append(e["dur"])
    return {
        "span_ms": (max(e["ts"] + e["dur"] for e in host) - min(e["ts"] for e in host)) / 1e3,
        "lag_median_us": statistics.median(lags) if lags else float("nan"),
        "lag_p10_us": lags[len(lags) // 10] if lags else float("nan"),
        "gpu_busy_ms": covered([(e["ts"], e["ts"] + e["dur"]) for e in gpu]) / 1e3,
        "wait_kernels_ms": sum(e["dur"] for e in kernels if any(w in e["name"] for w in WAIT_KERNELS)) / 1e3,
        "host_busy_ms": sum(covered(v) for v in threads.values()) / 1e3,
        "sync_ms": sum(e["dur"] for e in runtime if e["name"] in SYNC_CALLS) / 1e3,
        "idle_ms": [v / 1e3 for v in idle],
        "calls_us": {k: statistics.median(v) for k, v in calls.items()},
        "barriers": [e["ts"] for e in kernels if "barrier_kernel" in e["name"]],
    }


def timeline(path, from_ms, length_ms):
    """Lines 'start_us dur_us stream kind name' of the GPU events in [from_ms, from_ms + length_ms)."""
    gpu = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X" and e.get("cat") in GPU_EVENTS]
    if not gpu:
        raise SystemExit(f"{path}: no GPU events")
    t0 = min(e["ts"] for e in gpu)
    lines = []
    for e in sorted(gpu, key=lambda e: e["ts"]):
        t = e["ts"] - t0
        if from_ms * 1e3 <= t < (from_ms + length_ms) * 1e3:
            lines.append(f"{t:10.1f} {e['dur']:8.1f}  stream {e.get('tid')!s:<4} {GPU_EVENTS[e['cat']]:6} {e['name'][:100]}")
    return lines


def main(argv):
    if not argv:
        print("usage: trace_ranks.py T.json [T.rank1.json ...] | --timeline FROM_MS LENGTH_MS T.json", file=sys.stderr)
        return 2
    if argv[0] == "--timeline":
        if len(argv) != 4:
            print("usage: trace_ranks.py --timeline FROM_MS LENGTH_MS TRACE.json", file=sys.stderr)
            return 2
        print("\n".join(timeline(argv[3], float(argv[1]), float(argv[2]))))
        return 0
    paths = argv
    if len(paths) == 1:
        base, ext = os.path.splitext(paths[0])
        paths += sorted(glob.glob(f"{base}.rank*{ext}"), key=lambda p: int(p[len(base) + 5:-len(ext)]))
    ranks = [rank_figures(p) for p in paths]
    print("rank | launch->start median / p10 (us) | GPU busy ms | of it wait kernels ms | "
          "no kernel ms: host late / beside copies / other | host busy ms (sync) | "
          + " | ".join(f"{c} us" for c in HOST_CALLS))
    for r, f in enumerate(ranks):
        print(f"{r} | {f['lag_median_us']:.0f} / {f['lag_p10_us']:.0f} | {f['gpu_busy_ms']:.1f} of {f['span_ms']:.1f} | "
              f"{f['wait_kernels_ms']:.1f} | {' / '.join(f'{v:.1f}' for v in f['idle_ms'])} | "
              f"{f['host_busy_ms']:.1f} ({f['sync_ms']:.1f}) | "
              + " | ".join(f"{f['calls_us'].get(c, float('nan')):.1f}" for c in HOST_CALLS))
    n = min(len(f["barriers"]) for f in ranks)
    if len(ranks) > 1 and n:
        last = collections.Counter(max(range(len(ranks)), key=lambda r: ranks[r]["barriers"][i]) for i in range(n))
        print(f"last to arrive at the {n} barriers: " + ", ".join(f"rank {r} {c}x" for r, c in last.most_common()))
    host_bound = [r for r, f in enumerate(ranks) if f["lag_median_us"] < 1000]
    if host_bound:
        print("host-bound (kernels start within 1 ms of their launch, median): rank(s) "
              + ", ".join(map(str, host_bound)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
