#!/usr/bin/env python3
"""Where the tensor-parallel ranks wait for each other: the `TP barrier waits by place in the step`
lines that ME_TP_BARRIER_LOG=1 makes every rank log (one per rank and progress line, microseconds
per timed wait: the copy engines' reduce-scatter barriers, or their arrival waits), summed up by
site over the micro-batches of a step.

With tensor parallelism alone (no pipeline) a micro-batch's timed waits come in a fixed order:
forward, two per layer (the attention projection's, then the second MLP layer's reduce-scatter);
backward, the output layer's, then two per layer from the last (the first MLP layer's, QKV's).
So a step of M micro-batches and L layers has M x (4L + 1) places. For each log window and site
this prints the mean over the micro-batches of the least any rank waited and of the ranks' mean:
where even the least-waiting rank waits, the ranks' GPUs drift apart over the work before it.

    python3 bench/speed/barrier_places.py RUN.log --layers 2

Standard library only.
"""
import argparse
import re
import sys

LINE = re.compile(r"\[rank (\d+)[^\]]*\].*TP barrier waits by place in the step \(us, mean of \d+ steps\): ([\d ]+)")


def sites(layers):
    """The names of one micro-batch's timed waits, in order."""
    forward = [f"fwd L{l} {s}" for l in range(1, layers + 1) for s in ("proj", "fc2")]
    backward = ["bwd logits"] + [f"bwd L{l} {s}" for l in range(layers, 0, -1) for s in ("fc1", "qkv")]
    return forward + backward


def windows_by_rank(lines):
    """{rank: [[us per place] per log window, in order]}"""
    out = {}
    for line in lines:
        m = LINE.search(line)
        if m:
            out.setdefault(int(m.group(1)), []).append([int(x) for x in m.group(2).split()])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("log")
    p.add_argument("--layers", type=int, required=True, help="model.layers of the run (tp only, no pipeline)")
    a = p.parse_args()
    names = sites(a.layers)
    ranks = windows_by_rank(open(a.log, errors="replace"))
    if not ranks:
        sys.exit(f"{a.log}: no 'TP barrier waits by place' lines (was it run with ME_TP_BARRIER_LOG=1 on the copy engines?)")
    windows = min(len(w) for w in ranks.values())
    print(f"{len(ranks)} ranks, {windows} log windows; us per wait, least rank / mean of ranks, "
          "the mean over a step's micro-batches")
    print("window | " + " | ".join(names) + " | step ms, least / mean")
    for w in range(windows):
        rows = [ranks[r][w] for r in sorted(ranks)]
        places = len(rows[0])
        if any(len(r) != places for r in rows) or places % len(names):
            sys.exit(f"window {w + 1}: {places} places is not a whole number of micro-batches of "
                     f"{len(names)} waits each (--layers {a.layers}; tp only?)")
        least = [min(r[i] for r in rows) for i in range(places)]
        mean = [sum(r[i] for r in rows) / len(rows) for i in range(places)]
        micro = places // len(names)
        cells = [f"{sum(least[i::len(names)]) / micro:.0f} / {sum(mean[i::len(names)]) / micro:.0f}"
                 for i in range(len(names))]
        print(f"{w + 1} | " + " | ".join(cells) + f" | {sum(least) / 1000:.2f} / {sum(mean) / 1000:.2f}")


if __name__ == "__main__":
    main()
