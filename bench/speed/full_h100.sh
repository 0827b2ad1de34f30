#!/usr/bin/env bash
# The H100 table of bench/RESULTS.md in one device call: build, GPU unit tests, then
# bench/speed/run.sh (measured peak, megaengine and the PyTorch references for each model) plus
# megaengine with its own CUDA kernels switched off (ME_KERNELS=none, or each value of
# ME_BENCH_KERNELS_OFF), and rows with other recipe settings (ME_BENCH_EXTRA; by default one in
# precision = "fp8"), in the same call.
#   bash bench/speed/full_h100.sh OUT_DIR          (after `source .debs/device-env.sh`)
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$1 build=${ME_BENCH_BUILD:-/tmp/b}
mkdir -p "$out"
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$out/cmake.log" 2>&1 &&
  cmake --build "$build" > "$out/build.log" 2>&1 || { grep -E "error" -A3 "$out/build.log" | head -40; exit 1; }
"$build/tests/me_unit_tests" "[gpu]" > "$out/unit_gpu.log" 2>&1
grep -E -B3 -A12 "FAILED" "$out/unit_gpu.log" | head -60
tail -2 "$out/unit_gpu.log"
export ME_BENCH_STEPS=${ME_BENCH_STEPS:-20} ME_BENCH_WARMUP=${ME_BENCH_WARMUP:-5}
bash "$repo/bench/speed/run.sh" "$build" "$out/speed" ${ME_BENCH_MODELS:-gpt1.3b llama1b} > "$out/speed.log" 2>&1
grep -E "peak|iteration .*/|failed" "$out/speed.log" | cut -c1-160
peak=$(python3 "$repo/bench/speed/table.py" --peak "$out/speed/rows.jsonl")
for m in ${ME_BENCH_MODELS:-gpt1.3b llama1b}; do
  for k in ${ME_BENCH_KERNELS_OFF:-none}; do
    ME_KERNELS=$k ME_BENCH_MODEL=$m ME_BENCH_PEAK=$peak ME_BENCH_JSON=$out/speed/rows.jsonl \
      "$build/megaengine" "$repo/bench/speed/megaengine_row.lua" > "$out/$m.${k//,/_}.log" 2>&1 ||
      tail -3 "$out/$m.${k//,/_}.log"  # no commas in file names: the device tool does not return them
  done
done
# Extra rows: recipe overrides, rows separated by ';' (e.g. ME_BENCH_EXTRA="parallel.grad_reduce_dtype=bf16");
# unset, one row in precision = "fp8" per model (ME_BENCH_EXTRA= for none).
IFS=';' read -ra extras <<< "${ME_BENCH_EXTRA-precision=fp8}"
for m in ${ME_BENCH_MODELS:-gpt1.3b llama1b}; do
  for e in "${extras[@]}"; do
    log=$out/$m.${e//[^a-z0-9]/_}.log
    ME_BENCH_OVERRIDES="$e" ME_BENCH_LABEL="$e" ME_BENCH_MODEL=$m ME_BENCH_PEAK=$peak \
      ME_BENCH_JSON=$out/speed/rows.jsonl "$build/megaengine" "$repo/bench/speed/megaengine_row.lua" > "$log" 2>&1 ||
      tail -3 "$log"
  done
done
python3 "$repo/bench/speed/table.py" "$out/speed/rows.jsonl" | tee "$out/table.md"
