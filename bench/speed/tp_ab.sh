#!/usr/bin/env bash
# A tensor-parallel change against its base in one device call: builds BASE_SRC (a source tree,
# e.g. `git archive <commit> | tar -x -C .baseline`) and this tree side by side, checks this
# tree's GPU paths (dev/cuda's checkers that exist in it, gemm_algos among them, the GPU unit tests, the copy engines
# against NCCL), then the per-layer rows of bench/speed/tp_width.sh for both trees in the same
# call (this tree: ME_BENCH_VARIANTS; the base: SP only), then one GPU against the base
# (bench/speed/before_after.sh on GPU 0). Every part is skipped once ME_BENCH_DEADLINE_S (540) has
# passed, so the call ends inside the device's 10 minutes with what it has.
#   source .debs/device-env.sh && bash bench/speed/tp_ab.sh BASE_SRC OUT_DIR [MODEL ...]   (default gpt39b-2l)
# Environment: ME_BENCH_TPS (4 with 4 GPUs, else 2), ME_BENCH_VARIANTS (tp_width.sh's; default SP),
# ME_BENCH_ONE_GPU (1: the before/after on GPU 0; 0: not), ME_BENCH_CHECKS (1: the GPU checks; 0: not, for a
# second call on the same tree).
# OUT_DIR ends with summary.md and results.tgz (the logs): two files, as the device returns few.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
base=$(cd "$1" && pwd) out=$2
shift 2
models=${*:-gpt39b-2l}
deadline=${ME_BENCH_DEADLINE_S:-540}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
tps=${ME_BENCH_TPS:-$([ "$gpus" -ge 4 ] && echo 4 || echo 2)}
variants=${ME_BENCH_VARIANTS:-"SP:parallel.sequence_parallel=true"}
work=$out/work
mkdir -p "$work"
summary=$out/summary.md
t0=$SECONDS
left() { [ $((SECONDS - t0)) -lt "$deadline" ]; }
say() { echo "$*" | tee -a "$summary"; }
: > "$summary"
say "# tp_ab: $(cd "$repo" && git log --oneline -1 2>/dev/null || echo 'this tree') against $base, $gpus GPUs, tp $tps"

build() {  # build SRC DIR TARGETS...
  local src=$1 dir=$2
  shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$work/$(basename "$dir").cmake.log" 2>&1 &&
    cmake --build "$dir" --target "$@" -j "$(($(nproc) / 2))" > "$work/$(basename "$dir").build.log" 2>&1
}
checks=${ME_BENCH_CHECKS:-1}
checkers=() check_targets=()
for k in sum_parts copy_twice chunk_gemm gemm_algos peer_buffers; do [ -f "$repo/dev/cuda/$k.cu" ] && checkers+=("dev_cuda_$k"); done
[ "$checks" = 1 ] && check_targets=(me_unit_tests "${checkers[@]}")
build "$base" /tmp/b_base megaengine &
pb=$!
build "$repo" /tmp/b_cur megaengine "${check_targets[@]}" &
pc=$!
wait $pc || { say "current build failed"; grep -A5 error "$work/b_cur.build.log" | head -30 | tee -a "$summary"; exit 1; }
wait $pb || { say "base build failed"; grep -A5 error "$work/b_base.build.log" | head -30 | tee -a "$summary"; exit 1; }
say "both built in $((SECONDS - t0)) s"

if [ "$checks" = 1 ]; then
  say "## checks"
  for c in "${checkers[@]}"; do
    k=${c#dev_cuda_}
    args=()
    [ "$k" = peer_buffers ] && args=("$tps")
    timeout 120 "/tmp/b_cur/dev/cuda/$k" "${args[@]}" > "$work/$k.log" 2>&1
    say "dev/cuda/$k: exit $? ($(grep -cE 'FAIL' "$work/$k.log") FAIL lines)"
    grep -E 'time |host |local copy' "$work/$k.log" | head -8 | sed 's/^/    /' >> "$summary"
    # gemm_algos: the shapes whose fastest candidate beats the first by 3% or more
    [ "$k" = gemm_algos ] && grep -E 'DIFFERENT|gain +([3-9]|[1-9][0-9])\.' "$work/$k.log" | cut -c1-200 | head -24 |
      sed 's/^/    /' >> "$summary"
  done
  timeout 200 /tmp/b_cur/tests/me_unit_tests "[gpu]" > "$work/unit_gpu.log" 2>&1
  say "me_unit_tests [gpu]: exit $?, $(tail -2 "$work/unit_gpu.log" | tr '\n' ' ')"
  timeout 200 bash "$repo/tests/cli/tp_copy_engine_gpu.sh" /tmp/b_cur/megaengine > "$work/tp_copy_engine_gpu.log" 2>&1
  say "tp_copy_engine_gpu.sh: exit $?; $(grep -h 'losses compared' "$work/tp_copy_engine_gpu.log" | tr '\n' ';')"
fi

say "## layer rows (this tree, then the base)"
for model in $models; do
  left || { say "$model: skipped (deadline)"; continue; }
  ME_BENCH_DEADLINE_S=$((deadline - (SECONDS - t0) - 120)) ME_BENCH_BUILD=/tmp/b_cur ME_BENCH_TPS=$tps \
    ME_BENCH_VARIANTS="$variants" bash "$repo/bench/speed/tp_width.sh" "$work/cur-$model" "$model" > "$work/cur-$model.out" 2>&1
  grep '^|' "$work/cur-$model/table.md" >> "$summary"
  left || { say "base $model: skipped (deadline)"; continue; }
  ME_BENCH_DEADLINE_S=$((deadline - (SECONDS - t0) - 60)) ME_BENCH_BUILD=/tmp/b_base ME_BENCH_TPS=$tps \
    ME_BENCH_VARIANTS="SP:parallel.sequence_parallel=true" bash "$base/bench/speed/tp_width.sh" "$work/base-$model" "$model" \
    > "$work/base-$model.out" 2>&1
  grep '^|' "$work/base-$model/table.md" | tail -n +3 | sed 's/^| /| base: /' >> "$summary"
done

if [ "${ME_BENCH_ONE_GPU:-1}" = 1 ] && left; then
  say "## one GPU (GPU 0), this tree against the base"
  CUDA_VISIBLE_DEVICES=0 ME_BENCH_ROUNDS=1 ME_BENCH_BASE_BUILD=/tmp/b_base ME_BENCH_CUR_BUILD=/tmp/b_cur \
    bash "$repo/bench/speed/before_after.sh" "$base" "$work/ba" gpt1.3b llama1b > "$work/before_after.out" 2>&1
  grep -E 'current/base|peak' "$work/before_after.out" | tee -a "$summary"
fi
say "whole call: $((SECONDS - t0)) s"
tar czf "$out/results.tgz" -C "$out" work && rm -rf "$work"
