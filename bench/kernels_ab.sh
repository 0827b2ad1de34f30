#!/usr/bin/env bash
# engine/kernels on the GPU machine, in one go: each kernel's checker and micro-benchmark
# (dev/cuda), the GPU unit tests (kernels against their LibTorch compositions), then training
# rows with the kernels on, off, and each one off alone (ME_KERNELS), so the table shows what
# each pays for at the step level.
#   bench/kernels_ab.sh BUILD_DIR OUT_DIR [MODEL ...]       (default: llama1b gpt1.3b)
# Environment: ME_BENCH_STEPS (20), ME_BENCH_WARMUP (5), ME_BENCH_PEAK (0: MFU omitted),
#   ME_KERNELS_AB (default "all none"): entries KERNELS[@ATTENTION], KERNELS one of all, none,
#   -op (all but one), or a comma list; ATTENTION an ME_ATTENTION value (auto, flash, cudnn).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$1 out=$2
shift 2
models=${*:-llama1b gpt1.3b}
mkdir -p "$out"
status=0
for k in swiglu rotary cross_entropy adamw add_norm gemm_gelu chunk_gemm; do
  echo "== dev/cuda/$k"
  "$build/dev/cuda/$k" > "$out/dev_cuda_$k.log" 2>&1 || { status=1; echo "dev/cuda/$k FAILED"; }
  grep -E "^[a-z]|FAIL|time " "$out/dev_cuda_$k.log"
done
echo "== GPU unit tests"
"$build/tests/me_unit_tests" "[gpu]" > "$out/unit_gpu.log" 2>&1
grep -E -B3 -A12 "FAILED" "$out/unit_gpu.log" | head -80
tail -3 "$out/unit_gpu.log"
grep -q "All tests passed" "$out/unit_gpu.log" || status=1
all="swiglu rotary cross_entropy adamw linear_bias add_norm gemm_gelu chunk_gemm wgrad_gemm"
for m in $models; do
  for entry in ${ME_KERNELS_AB:-all none}; do
    variant=${entry%@*} attention=auto
    [ "$entry" != "$variant" ] && attention=${entry#*@}
    case $variant in
      all|none) kernels=$variant ;;
      -*) kernels=$(echo $all | tr ' ' '\n' | grep -vx "${variant#-}" | paste -sd, -) ;;
      *) kernels=$variant ;;
    esac
    echo "== $m, ME_KERNELS=$kernels ME_ATTENTION=$attention"
    ME_KERNELS=$kernels ME_ATTENTION=$attention ME_BENCH_MODEL=$m ME_BENCH_STEPS=${ME_BENCH_STEPS:-20} ME_BENCH_WARMUP=${ME_BENCH_WARMUP:-5} \
      ME_BENCH_PEAK=${ME_BENCH_PEAK:-0} ME_BENCH_JSON=$out/rows.jsonl \
      "$build/megaengine" "$repo/bench/speed/megaengine_row.lua" > "$out/$m.$kernels.$attention.log" 2>&1 ||
      { echo "failed:"; tail -5 "$out/$m.$kernels.$attention.log"; status=1; }
    grep -a "fused CUDA kernels\|iteration .*/" "$out/$m.$kernels.$attention.log" | cut -c1-160
  done
done
python3 "$repo/bench/speed/table.py" "$out/rows.jsonl" | tee "$out/table.md"
exit $status
