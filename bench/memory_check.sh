#!/usr/bin/env bash
# The memory estimate against the GPU: for each configuration, the peak `megaengine --dry-run`
# predicts for rank 0 ("predicted peak GPU memory on rank 0: N MiB") and the peak LibTorch's
# allocator reached in 3 training iterations ("peak GPU memory on rank 0: N MiB" at the end of the
# run), and their difference. Different widths, depths, micro batches, fp32, bf16 and fp8, recompute
# none / selective / full, bf16 gradients; with 2 or more GPUs also data parallelism with the
# distributed optimizer, tensor + sequence parallelism and a pipeline. Exit status 1 if any
# prediction is off by more than 10%.
#   bash bench/memory_check.sh /path/to/megaengine [WORK_DIR]     (about 3 minutes on one H100)
# ME_MC_ONLY=REGEX runs only the configurations whose names match; ME_MC_PEAK=TFLOPS gives the
# width rows an MFU.
# The table goes to stdout; each run's log and dry run stay in WORK_DIR (default: a new temporary
# directory), since a device call brings back only a few files.
set -uo pipefail
bin=$1
out=${2:-$(mktemp -d)}
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
echo "logs in $out"
export NCCL_NVLS_ENABLE=0
# Byte-level text to train on (its content does not change the memory): the fetched Moby Dick,
# else generated text.
text=$out/text.txt
if [ -f "${ME_ASSET_DIR:-$repo/assets}/moby-dick.txt" ]; then cp "${ME_ASSET_DIR:-$repo/assets}/moby-dick.txt" "$text"
else head -c 6000000 /dev/urandom | base64 > "$text"; fi
export ME_MC_TEXT=$text
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$ngpu" -ge 1 ] || { echo "bench/memory_check.sh needs a CUDA GPU"; exit 2; }

rows=$out/rows.txt
: > "$rows"
check() {  # name nproc family overrides...
  local name=$1 nproc=$2 family=$3
  shift 3
  [[ $name =~ ${ME_MC_ONLY:-.} ]] || return 0  # ME_MC_ONLY=REGEX: only the configurations it matches
  local log=$out/$name.log predicted measured
  predicted=$(ME_MC_FAMILY=$family "$bin" --dry-run "$repo/bench/memory_check.lua" --world "$nproc" "$@" 2>&1 |
    tee "$out/$name.dry_run.txt" | sed -n 's/^predicted peak GPU memory on rank 0: \([0-9]*\) MiB.*/\1/p')
  if [ "$nproc" -eq 1 ]; then
    CUDA_VISIBLE_DEVICES=0 ME_MC_FAMILY=$family timeout 300 "$bin" "$repo/bench/memory_check.lua" "$@" > "$log" 2>&1
  else
    ME_MC_FAMILY=$family timeout 300 "$bin" --nproc "$nproc" "$repo/bench/memory_check.lua" "$@" > "$log" 2>&1
  fi
  local rc=$?
  measured=$(grep -a -o 'peak GPU memory on rank 0: [0-9]*' "$log" | tail -1 | awk '{print $7}')
  if [ $rc -ne 0 ] || [ -z "$measured" ] || [ -z "$predicted" ]; then
    echo "$name: FAILED (exit $rc, predicted '${predicted}', measured '${measured}'); last lines of $log:"
    tail -5 "$log"
    echo "$name $nproc - - FAIL $*" >> "$rows"
    return
  fi
  echo "$name $nproc $predicted $measured ok $*" >> "$rows"
  echo "$name: predicted $predicted MiB, measured $measured MiB"
}

gpt13="model.layers=24 model.hidden=2048 model.heads=16"
llama1b="model.layers=22 model.hidden=2048 model.heads=32 model.query_groups=4 model.ffn_hidden=5632"
# shellcheck disable=SC2086
{
check gpt1.3b_bf16_micro4 1 gpt $gpt13 batch.micro=4
check llama1b_bf16_micro4 1 llama $llama1b batch.micro=4
check gpt350m_fp32_micro8_seq1024 1 gpt model.layers=24 model.hidden=1024 model.heads=16 model.seq=1024 precision=fp32 batch.micro=8
check llama32x1024_full_recompute_micro8 1 llama model.layers=32 model.hidden=1024 model.heads=16 model.query_groups=4 \
  model.ffn_hidden=2816 batch.micro=8 model.recompute=full
check gpt1.3b_selective_bf16grads_micro2 1 gpt $gpt13 batch.micro=2 model.recompute=selective parallel.grad_reduce_dtype=bf16
# precision = "fp8": linear inputs kept as fp8 x^T, the weights' fp8 casts kept through a step
check gpt1.3b_fp8_micro4 1 gpt $gpt13 batch.micro=4 precision=fp8
check llama1b_fp8_micro4 1 llama $llama1b batch.micro=4 precision=fp8
check gpt16x2560_full_every2_micro4 1 gpt model.layers=16 model.hidden=2560 model.heads=20 batch.micro=4 \
  model.recompute=full model.recompute_every=2
if [ "$ngpu" -ge 2 ]; then
  check gpt1.3b_dp2_distopt 2 gpt $gpt13 batch.micro=4 parallel.distributed_optimizer=true
  check gpt1.3b_tp2_sp 2 gpt $gpt13 batch.micro=4 parallel.tp=2 parallel.sequence_parallel=true
  check llama1b_pp2_micro2x8 2 llama $llama1b batch.micro=2 batch.global=16 parallel.pp=2
  # The user's widths at 8 layers on 2 GPUs (#25's stand-in until 8 GPUs are lent), with their
  # recipes' settings; 12 iterations so that the last progress line's rate and the step profile
  # (exposed communication) mean something.
  width_run="train.iters=12 train.log_interval=4 train.profile_at=10 train.profile_steps=2 train.peak_tflops=${ME_MC_PEAK:-0}"
  check gpt39b_width_8l_tp2_sp 2 gpt model.layers=8 model.hidden=8192 model.heads=64 batch.micro=1 \
    parallel.tp=2 parallel.sequence_parallel=true parallel.distributed_optimizer=true $width_run
  check llama2_70b_width_8l_tp2_sp 2 llama model.layers=8 model.hidden=8192 model.heads=64 model.query_groups=8 \
    model.ffn_hidden=28672 model.seq=4096 batch.micro=1 parallel.tp=2 parallel.sequence_parallel=true \
    model.recompute=full parallel.grad_reduce_dtype=bf16 parallel.distributed_optimizer=true $width_run
fi
}

echo
echo "| Configuration | GPUs | Predicted MiB | Measured MiB | Error |"
echo "|---|--:|--:|--:|--:|"
worst=0
while read -r name nproc predicted measured status _; do
  if [ "$status" != ok ]; then echo "| $name | $nproc | - | - | failed |"; worst=100; continue; fi
  err=$(awk -v p="$predicted" -v m="$measured" 'BEGIN { printf "%+.1f%%", 100 * (p - m) / m }')
  abs=$(awk -v p="$predicted" -v m="$measured" 'BEGIN { e = 100 * (p - m) / m; printf "%d", (e < 0 ? -e : e) }')
  [ "$abs" -gt "$worst" ] && worst=$abs
  echo "| $name | $nproc | $predicted | $measured | $err |"
done < "$rows"
echo
echo "device: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1), $ngpu GPU(s); largest error ${worst}%"
[ "$worst" -le 10 ]
