#!/usr/bin/env python3
"""Where a rank's host time goes: its host calls by name, from one step-profiler trace.

At tp 4 the step waits for the slowest rank's host (bench/RESULTS.md, nineteenth session), so
the host's calls are what to cut. For each name among the LibTorch ops (cpu_op), the CUDA
runtime and driver calls, and the user annotations of one Chrome trace (`train.profile_trace`),
this prints the calls per step and the self time per step (its own duration less that of the
calls nested in it on the same thread), heaviest first, and the totals.

    python3 bench/speed/trace_ops.py T.json [--steps 2] [--top 40]

Standard library only.
"""
import argparse
import collections
import json

HOST = ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation")


def self_times(events):
    """{name: [calls, self us]} over events on one thread, nested by their spans."""
    out = collections.defaultdict(lambda: [0, 0.0])
    stack = []  # (end, name, child time)
    events = sorted(events, key=lambda e: (e["ts"], -e["dur"]))

    def close(upto):
        while stack and stack[-1][0] <= upto:
            end, name, dur, child = stack.pop()
            out[name][1] += dur - child
            if stack:
                stack[-1][3] += dur

    for e in events:
        close(e["ts"])
        out[e["name"]][0] += 1
        stack.append([e["ts"] + e["dur"], e["name"], e["dur"], 0.0])
    close(float("inf"))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace")
    p.add_argument("--steps", type=int, default=2, help="profiled steps in the trace (train.profile_steps)")
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args()
    events = json.load(open(a.trace))["traceEvents"]
    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "dur" in e and e.get("cat") in HOST and not e["name"].startswith("ProfilerStep"):
            by_thread[e["tid"]].append(e)
    total = collections.defaultdict(lambda: [0, 0.0])
    for evs in by_thread.values():
        for name, (n, us) in self_times(evs).items():
            total[name][0] += n
            total[name][1] += us
    if not total:
        raise SystemExit(f"{a.trace}: no host events")
    rows = sorted(total.items(), key=lambda kv: -kv[1][1])
    all_calls = sum(n for n, _ in total.values())
    all_us = sum(us for _, us in total.values())
    print(f"host calls per step: {all_calls / a.steps:.0f}, self time per step {all_us / a.steps / 1000:.1f} ms")
    print(f"{'name':60s} {'calls/step':>10s} {'self ms/step':>12s} {'us/call':>8s}")
    for name, (n, us) in rows[: a.top]:
        print(f"{name[:60]:60s} {n / a.steps:10.0f} {us / a.steps / 1000:12.2f} {us / n:8.1f}")


if __name__ == "__main__":
    main()
