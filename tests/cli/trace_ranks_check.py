#!/usr/bin/env python3
"""bench/speed/trace_ranks.py on two synthetic rank traces: rank 1's host is slow (its kernels start
right after their launch) and it reaches every barrier last; rank 0 runs ahead and waits. Then the
idle split on a third trace built to have 60 ms of host lateness, 30 ms beside a copy, 10 ms other."""
import json
import os
import subprocess
import sys
import tempfile

script, = sys.argv[1:]


def trace(path, lag_us, barrier_at, barrier_us):
    events, t = [], 0.0
    for i in range(40):  # 40 launches, each kernel starting lag_us after its launch call
        corr = i + 1
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t, "dur": 8.0,
                       "tid": 1, "args": {"correlation": corr}})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": t - 20, "dur": 30.0, "tid": 1})
        name = "me::kernels::barrier_kernel(unsigned long**, int, int, unsigned long)" if i % 10 == 0 else "gemm"
        start = barrier_at[i // 10] if i % 10 == 0 else t + lag_us
        events.append({"ph": "X", "cat": "kernel", "name": name, "ts": start,
                       "dur": barrier_us if i % 10 == 0 else 50.0, "tid": 7, "args": {"correlation": corr}})
        t += 100.0
    json.dump({"traceEvents": events}, open(path, "w"))


with tempfile.TemporaryDirectory() as d:
    trace(os.path.join(d, "t.json"), 5000.0, [0, 1000, 2000, 3000], 400.0)
    trace(os.path.join(d, "t.rank1.json"), 10.0, [300, 1300, 2300, 3300], 1.0)
    out = subprocess.run([sys.executable, script, os.path.join(d, "t.json")], capture_output=True, text=True)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.returncode
    rows = [l for l in out.stdout.splitlines() if l[:2] in ("0 ", "1 ")]
    assert len(rows) == 2, rows
    assert rows[0].startswith("0 | 5000 / 5000"), rows[0]
    assert rows[1].startswith("1 | 10 / 10"), rows[1]
    assert "last to arrive at the 4 barriers: rank 1 4x" in out.stdout
    assert "host-bound (kernels start within 1 ms of their launch, median): rank(s) 1" in out.stdout
    # Kernel A [0, 100) ms; B launched at 150 (its call returns at 158), runs [160, 260): 60 ms late;
    # C launched at 0, runs [300, 400), a copy [250, 290) before it: 30 ms beside it, 10 other.
    ms = 1000.0
    launch = lambda corr, at: {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": at * ms,
                               "dur": 8 * ms, "tid": 1, "args": {"correlation": corr}}
    kernel = lambda corr, at: {"ph": "X", "cat": "kernel", "name": "gemm", "ts": at * ms, "dur": 100 * ms,
                               "tid": 7, "args": {"correlation": corr}}
    events = [launch(1, 0), launch(3, 1), launch(2, 150), kernel(1, 0), kernel(2, 160), kernel(3, 300),
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy PtoP", "ts": 250 * ms, "dur": 40 * ms, "tid": 9}]
    json.dump({"traceEvents": events}, open(os.path.join(d, "idle.json"), "w"))
    out = subprocess.run([sys.executable, script, os.path.join(d, "idle.json")], capture_output=True, text=True)
    print(out.stdout, out.stderr)
    row = [l for l in out.stdout.splitlines() if l.startswith("0 ")]
    assert row and "| 60.0 / 30.0 / 10.0 |" in row[0], row
    # --timeline: rank 0's GPU events from 1 ms for 0.35 ms (its first GPU event at 0: the barrier at
    # 0 us; then the barrier at 1000 us and the GEMMs launched at 1100, 1200, 1300 + 5000 us lag are
    # outside the window)
    out = subprocess.run([sys.executable, script, "--timeline", "1.0", "0.35", os.path.join(d, "t.json")],
                         capture_output=True, text=True)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.returncode
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].split()[:2] == ["1000.0", "400.0"] and "barrier_kernel" in lines[0], lines
    # A trace with no GPU events is refused with its name.
    json.dump({"traceEvents": []}, open(os.path.join(d, "cpu.json"), "w"))
    bad = subprocess.run([sys.executable, script, os.path.join(d, "cpu.json")], capture_output=True, text=True)
    assert bad.returncode != 0 and "cpu.json: no GPU kernels" in bad.stderr, bad.stderr
print("trace_ranks: ok")
