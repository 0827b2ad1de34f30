#!/usr/bin/env python3
"""bench/speed/barrier_places.py on a synthetic two-rank log of a 1-layer model (5 timed waits a
micro-batch, 2 micro-batches a step): the least and mean per site over the micro-batches, the
step's totals, and the refusals of a log without such lines and of a wrong --layers."""
import os
import subprocess
import sys
import tempfile

script, = sys.argv[1:]


def run(log, layers):
    return subprocess.run([sys.executable, script, log, "--layers", str(layers)], capture_output=True, text=True)


with tempfile.TemporaryDirectory() as d:
    log = os.path.join(d, "run.log")
    prefix = "TP barrier waits by place in the step (us, mean of 4 steps): "
    with open(log, "w") as f:
        f.write("[rank 0]  iteration 4/8 | elapsed time per iteration (ms): 10.0\n")
        # rank 0 and rank 1: micro-batch 1, then 2; sites fwd L1 proj, fwd L1 fc2, bwd logits, bwd L1 fc1, bwd L1 qkv
        f.write("[rank 0] " + prefix + "10 20 30 40 50 12 22 32 42 52\n")
        f.write("[rank 1/2] " + prefix + "2 60 4 100 6 4 80 6 140 8\n")
    r = run(log, 1)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("2 ranks, 1 log windows"), lines
    assert lines[1] == "window | fwd L1 proj | fwd L1 fc2 | bwd logits | bwd L1 fc1 | bwd L1 qkv | step ms, least / mean", lines[1]
    # proj: least (2, 4) -> 3, mean ((10+2)/2, (12+4)/2) = (6, 8) -> 7; fc2: least (20, 22) -> 21,
    # mean (40, 51) -> 45.5 -> "46" (Python rounds half to even); logits: 5 / 18; fc1: least 41,
    # mean (70, 91) -> 80.5 -> "80"; qkv: 7 / 29. Step: least 2+20+4+40+6+4+22+6+42+8 = 154 us;
    # mean (310 + 410) / 2 = 360 us.
    assert lines[2] == "1 | 3 / 7 | 21 / 46 | 5 / 18 | 41 / 80 | 7 / 29 | 0.15 / 0.36", lines[2]
    r = run(log, 2)
    assert r.returncode != 0 and "not a whole number of micro-batches" in r.stderr, (r.returncode, r.stderr)
    empty = os.path.join(d, "empty.log")
    open(empty, "w").write("[rank 0] nothing here\n")
    r = run(empty, 1)
    assert r.returncode != 0 and "ME_TP_BARRIER_LOG=1" in r.stderr, r.stderr
print("barrier_places: ok")
