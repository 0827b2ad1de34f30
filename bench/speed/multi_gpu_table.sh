#!/usr/bin/env bash
# The multi-GPU table of bench/RESULTS.md (issue #7: 4 x H200) in one device call: build, then
# bench/speed/multi_gpu.sh for GPT 1.3B and LLaMA 1B with the rows the acceptance asks for, each
# model: one GPU, data-parallel over every GPU (plain; the distributed optimizer with its buffers
# in NCCL windows, with fp32 and with bf16 gradient reduction), torch.compile on one GPU,
# tp=2 + SP (all-gathers into registered slots), pp=2 and pp=2 x dp=2; with 4 GPUs instead issue
# #35's rows: dp 4 (plain; distributed optimizer, bf16 gradients), tp 4 + SP, pp 4, tp 2 x pp 2,
# tp 2 x dp 2, without the PyTorch reference rows (ME_BENCH_REF="compile" adds them).
#   source .debs/device-env.sh && bash bench/speed/multi_gpu_table.sh OUT_DIR
# Environment: ME_BENCH_BUILD (/tmp/b), ME_BENCH_MODELS ("gpt1.3b llama1b"), ME_BENCH_STEPS (8),
# ME_BENCH_WARMUP (4), ME_BENCH_DEADLINE_S (440: rows past it are skipped, so a 600 s call still
# ends with its table). OUT_DIR ends with table.md, rows.jsonl, summary.txt and logs.tgz (every row's log).
# On 2 x H200 the whole call took 358 s (bench/RESULTS.md, tenth session).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$1 build=${ME_BENCH_BUILD:-/tmp/b}
mkdir -p "$out"
t0=$SECONDS
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$out/cmake.log" 2>&1 &&
  cmake --build "$build" --target megaengine > "$out/build.log" 2>&1 ||
  { grep -E "error" -A3 "$out/build.log" | head -40; exit 1; }
echo "built in $((SECONDS - t0)) s"
distopt="parallel.distributed_optimizer=true parallel.symmetric_buffers=all comm.nccl_cta_policy=zero"
ngpu=$(nvidia-smi -L | wc -l)
if [ "$ngpu" -ge 4 ]; then
  # Issue #35's 4-GPU rows: dp 4 (plain; the distributed optimizer with bf16 gradients), tp 4 + SP,
  # pp 4, tp 2 x pp 2, tp 2 x dp 2; the tp rows profiled in the warm-up for their exposed
  # communication, the pp rows' 1F1B bubble named in the summary. No reference rows (ME_BENCH_REF).
  micro=${ME_BENCH_MICRO:-4} prof="train.profile_at=2 train.profile_steps=2"
  pp="parallel.pp_split=balanced batch.global=$((16 * micro))"
  export ME_BENCH_REF=${ME_BENCH_REF-} ME_BENCH_SKIP_PP=1 ME_BENCH_DP_EXTRA="$distopt parallel.grad_reduce_dtype=bf16"
  export ME_BENCH_ROWS="4:parallel.tp=4 parallel.sequence_parallel=true $prof;4:parallel.pp=4 $pp;4:parallel.tp=2 parallel.sequence_parallel=true parallel.pp=2 $pp $prof;4:parallel.tp=2 parallel.sequence_parallel=true $prof"
else
  export ME_BENCH_DP_EXTRA="$distopt; $distopt parallel.grad_reduce_dtype=bf16" ME_BENCH_TP_EXTRA="parallel.tp_symmetric_mb=4096"
fi
ME_BENCH_STEPS=${ME_BENCH_STEPS:-8} ME_BENCH_WARMUP=${ME_BENCH_WARMUP:-4} \
  ME_BENCH_DEADLINE_S=${ME_BENCH_DEADLINE_S:-440} ME_BENCH_SKIP_DISTOPT=1 ME_BENCH_REF_NPROC=1 ME_BENCH_SKIP_TP=1 \
  bash "$repo/bench/speed/multi_gpu.sh" "$build" "$out/multi" ${ME_BENCH_MODELS:-gpt1.3b llama1b} | tee "$out/summary.txt"
echo "whole call: $((SECONDS - t0)) s"
# The device tool returns only a few files: the table and rows as they are, the logs packed.
cp "$out/multi/table.md" "$out/multi/rows.jsonl" "$out/" 2>/dev/null
tar czf "$out/logs.tgz" -C "$out" multi cmake.log build.log && rm -rf "$out/multi" "$out/cmake.log" "$out/build.log"
