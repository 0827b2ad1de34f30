#!/usr/bin/env python3
"""bench/speed/trace_ops.py on a synthetic trace of two steps: self time is a call's own duration
less that of the calls nested in it on the same thread, counted per step, heaviest first."""
import json
import os
import subprocess
import sys
import tempfile

script, = sys.argv[1:]
events = []
for step in range(2):
    t = step * 1000.0
    # thread 1: aten::mm (40 us) holding a launch (10 us); autograd's thread 2: a node (100 us)
    # holding an aten::mm (30 us) holding a launch (10 us); a ProfilerStep span is ignored
    events += [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#%d" % step, "ts": t, "dur": 900.0, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": t + 10, "dur": 40.0, "tid": 1},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 20, "dur": 10.0, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "Node", "ts": t + 100, "dur": 100.0, "tid": 2},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": t + 110, "dur": 30.0, "tid": 2},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t + 115, "dur": 10.0, "tid": 2},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": t + 130, "dur": 500.0, "tid": 7},  # GPU: not host
    ]
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "t.json")
    json.dump({"traceEvents": events}, open(path, "w"))
    out = subprocess.run([sys.executable, script, path, "--steps", "2"], capture_output=True, text=True, check=True).stdout
print(out)
rows = {}
for line in out.splitlines()[2:]:
    name, calls, self_ms, us = line.rsplit(None, 3)
    rows[name.strip()] = (float(calls), float(self_ms), float(us))
assert out.splitlines()[0] == "host calls per step: 5, self time per step 0.1 ms", out.splitlines()[0]
assert list(rows) == ["Node", "aten::mm", "cudaLaunchKernel"], list(rows)  # 70, 50 (30 + 20), 20 us a step
assert rows["Node"] == (1, 0.07, 70.0), rows["Node"]
assert rows["aten::mm"] == (2, 0.05, 25.0), rows["aten::mm"]
assert rows["cudaLaunchKernel"] == (2, 0.02, 10.0), rows["cudaLaunchKernel"]
print("trace_ops_check: passed")
