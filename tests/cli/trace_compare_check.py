#!/usr/bin/env python3
"""bench/speed/trace_compare.py on two synthetic traces: tp 1 (two 100 us GEMMs, a 10 us kernel of
LibTorch's, gaps of 5 and 50 us, and a copy on another stream that is not the compute stream) and
tp 2 (two 55 us GEMMs, the same kernel at 5 us, a barrier, a reduce-scatter sum, a 4 us gap): each
kind's time, its excess over half of tp 1's, the idle split, and a trace with no GPU events refused."""
import json
import os
import subprocess
import sys
import tempfile

script, = sys.argv[1:]


def trace(path, kernels, stream_extra=()):
    """kernels: (name, start us, duration us) on stream 7; stream_extra: the same on stream 9."""
    events = [{"ph": "X", "cat": "kernel", "name": n, "ts": t, "dur": d, "pid": 0, "tid": 7} for n, t, d in kernels]
    events += [{"ph": "X", "cat": "gpu_memcpy", "name": n, "ts": t, "dur": d, "pid": 0, "tid": 9} for n, t, d in stream_extra]
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1000, "pid": 1, "tid": 1})
    json.dump({"traceEvents": events}, open(path, "w"))


small = "void at::native::(anonymous namespace)::foo_kernel<float, 4>(float const*, long)"
with tempfile.TemporaryDirectory() as d:
    a, b = os.path.join(d, "tp1.json"), os.path.join(d, "tp2.json")
    # tp 1: GEMM [0,100), gap 5, GEMM [105,205), gap 50, small [255,265)
    trace(a, [("nvjet_sm90_tst_256x128_TNT", 0, 100), ("nvjet_sm90_tst_256x128_TNT", 105, 100), (small, 255, 10)],
          [("Memcpy DtoD (Device -> Device)", 0, 90)])
    # tp 2: GEMM [0,55), barrier [55,63), sum [63,67), gap 4, GEMM [71,126), small [126,131)
    trace(b, [("nvjet_sm90_tst_256x128_TNT", 0, 55), ("me::kernels::(anonymous namespace)::barrier_kernel(unsigned long**)", 55, 8),
              ("void me::kernels::(anonymous namespace)::sum_parts_kernel<__nv_bfloat16, 8>(int)", 63, 4),
              ("nvjet_sm90_tst_256x128_TNT", 71, 55), (small, 126, 5)])
    out = subprocess.run([sys.executable, script, a, b], capture_output=True, text=True)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.returncode
    rows = {l.split(" | ")[0]: l for l in out.stdout.splitlines() if " | " in l}
    assert rows["GEMM"] == "GEMM | 0.20 (2) | 0.11 (2) | +0.01", rows["GEMM"]
    assert rows["copy-engine barrier"] == "copy-engine barrier | 0.00 (0) | 0.01 (1) | +0.01", rows["copy-engine barrier"]
    assert rows["reduce-scatter sum"] == "reduce-scatter sum | 0.00 (0) | 0.00 (1) | +0.00", rows["reduce-scatter sum"]
    assert rows["foo_kernel"] == "foo_kernel | 0.01 (1) | 0.01 (1) | +0.00", rows["foo_kernel"]
    assert "memcpy" not in rows, "the copy on stream 9 is not the compute stream's"
    assert rows["idle, gaps up to 10 us"].endswith("| 0.01 | 0.00 | +0.00"), rows["idle, gaps up to 10 us"]
    assert rows["idle, longer gaps"] == "idle, longer gaps | 0.05 | 0.00 | -0.03", rows["idle, longer gaps"]
    assert rows["span (first kernel to last)"] == "span (first kernel to last) | 0.27 | 0.13 | -0.00", rows["span (first kernel to last)"]
    # the largest excess first: GEMM (+10 us), barrier (+8 us), sum (+4 us), foo_kernel (0)
    order = [l.split(" | ")[0] for l in out.stdout.splitlines()[2:6]]
    assert order == ["GEMM", "copy-engine barrier", "reduce-scatter sum", "foo_kernel"], order
    json.dump({"traceEvents": []}, open(os.path.join(d, "cpu.json"), "w"))
    bad = subprocess.run([sys.executable, script, a, os.path.join(d, "cpu.json")], capture_output=True, text=True)
    assert bad.returncode != 0 and "cpu.json: no GPU kernels" in bad.stderr, bad.stderr
print("trace_compare: ok")
