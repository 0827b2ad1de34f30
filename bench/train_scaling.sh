#!/usr/bin/env bash
# One device call: the bf16 matmul peak, then bench/gpt350m.lua on 1 GPU and data-parallel
# over 2 and 4 GPUs (same micro batch per GPU), with and without the distributed optimizer.
# Prints each run's last progress line and peak memory, and tokens/s per GPU vs one GPU.
#   bash bench/train_scaling.sh /path/to/megaengine [iters]
set -uo pipefail
bin=$1
iters=${2:-40}
ngpu=$(nvidia-smi -L | wc -l)
peak=$("$bin" bench/matmul_peak.lua | tee /dev/stderr | awk '/bf16 matmul peak/ {print $4}')
run() {  # name nproc overrides...
  local name=$1 nproc=$2
  shift 2
  local log=${OUT:-/tmp}/train_$name.log
  if [ "$nproc" -eq 1 ]; then
    CUDA_VISIBLE_DEVICES=0 "$bin" bench/gpt350m.lua train.iters="$iters" train.peak_tflops="$peak" "$@" > "$log" 2>&1
  else
    "$bin" --nproc "$nproc" bench/gpt350m.lua train.iters="$iters" train.peak_tflops="$peak" "$@" > "$log" 2>&1
  fi
  local rc=$?
  local tps
  tps=$(grep -o 'tokens/s: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  echo "== $name ($nproc GPU, rc $rc): $(grep ' iteration ' "$log" | tail -1 | sed 's/^\[rank 0\] //')"
  grep -h 'peak GPU memory\|distributed optimizer:' "$log" | sed 's/^\[rank 0\] /   /'
  echo "$name $nproc ${tps:-0}" >> "${OUT:-/tmp}/scaling.txt"
}
rm -f "${OUT:-/tmp}/scaling.txt"
run gpu1 1
[ "$ngpu" -ge 2 ] && run dp2 2
[ "$ngpu" -ge 4 ] && run dp4 4
[ "$ngpu" -ge 4 ] && run dp4_distopt 4 parallel.distributed_optimizer=true
[ "$ngpu" -ge 2 ] && run tp2 2 parallel.tp=2
awk 'NR == 1 { base = $3 } { printf "%-12s %d GPU  tokens/s %8d  per GPU %8.0f  = %.1f%% of one GPU\n", $1, $2, $3, $3 / $2, 100 * $3 / $2 / base }' "${OUT:-/tmp}/scaling.txt"
