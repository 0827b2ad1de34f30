#!/usr/bin/env bash
# The speed benchmark in one go, on the GPU machine: the measured bf16 matmul peak, then for
# each model megaengine and the plain-PyTorch reference (eager and torch.compile) on the same
# GPU, same sizes, same optimizer; prints bench/speed/table.py's table with the ratios.
#   bench/speed/run.sh BUILD_DIR OUT_DIR [MODEL ...]      (default models: gpt1.3b llama1b)
# Environment: ME_BENCH_MICRO (default 4), ME_BENCH_STEPS (30), ME_BENCH_WARMUP (10),
#   ME_BENCH_REFERENCE=0 to skip the PyTorch runs.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$1 out=$2
shift 2
models=${*:-gpt1.3b llama1b}
micro=${ME_BENCH_MICRO:-4}
steps=${ME_BENCH_STEPS:-30} warmup=${ME_BENCH_WARMUP:-10}
rows=$out/rows.jsonl
# The reference trains on the bytes megaengine's rows read (me.asset "moby-dick.txt"): the GPU's
# clocks under its power cap depend on the numbers multiplied, so both get the same data.
text=${ME_ASSET_DIR:-$repo/assets}/moby-dick.txt
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0

python3 "$repo/bench/reference/matmul_peak.py" --json "$rows" | tail -1
peak=$(python3 "$repo/bench/speed/table.py" --peak "$rows")
echo "bf16 matmul peak: $peak TFLOP/s"
for m in $models; do
  echo "== $m: megaengine"
  ME_BENCH_MODEL=$m ME_BENCH_MICRO=$micro ME_BENCH_PEAK=$peak ME_BENCH_STEPS=$steps ME_BENCH_WARMUP=$warmup \
    ME_BENCH_JSON=$rows "$build/megaengine" "$repo/bench/speed/megaengine_row.lua" > "$out/$m.megaengine.log" 2>&1 ||
    { echo "megaengine $m failed:"; tail -5 "$out/$m.megaengine.log"; }
  grep -a "iteration .*/" "$out/$m.megaengine.log" | tail -1 | cut -c1-250
  if [ "${ME_BENCH_REFERENCE:-1}" != 0 ]; then
    for mode in eager compile; do
      echo "== $m: pytorch $mode"
      python3 "$repo/bench/reference/train_ref.py" --model "$m" --mode "$mode" --micro "$micro" --steps "$steps" \
        --warmup "$warmup" --peak-tflops "$peak" --json "$rows" --text "$text" > "$out/$m.$mode.log" 2>&1 ||
        { echo "reference $m $mode failed:"; tail -5 "$out/$m.$mode.log"; }
      tail -1 "$out/$m.$mode.log" | cut -c1-250
    done
  fi
done
python3 "$repo/bench/speed/table.py" "$rows" | tee "$out/table.md"
