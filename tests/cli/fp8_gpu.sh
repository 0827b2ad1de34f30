#!/usr/bin/env bash
# precision = "fp8" on 2 GPUs (issue #36, acceptance 3), the equivalence recipe of
# tests/lua/train_parallel.lua at a width where fp8 GEMMs are what runs (hidden 256, seq 128,
# 20 steps): tp 2 + sequence parallelism and pp 2 against one GPU's fp8 run, every step's loss
# and gradient norm within fp8's tolerance (tp shards cast with their own scales; pp stages cast
# what one GPU casts, up to the GPU's own reduction order); and a run stopped at step 10 and
# resumed, whose steps 11-20 follow the uninterrupted run's (the scales resume with it).
#   bash tests/cli/fp8_gpu.sh BUILD_DIR/megaengine
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
script=$here/lua/train_parallel.lua
export NCCL_NVLS_ENABLE=0
# lr 5e-4: at the recipe's 2e-3 this small model's loss spiked at step 7 in every layout (grad
# norm 80-125), after which the layouts' curves are too chaotic to compare
common="device=cuda precision=fp8 model.hidden=256 model.seq=128 optimizer.lr=5e-4"

run() {  # name nproc overrides...
  local name=$1 nproc=$2
  shift 2
  # shellcheck disable=SC2086
  ME_LOSS_FILE=$tmp/$name timeout 300 "$bin" --nproc "$nproc" "$script" $common "$@" > "$tmp/$name.log" 2>&1 ||
    { echo "FAILED: $name did not run:"; tail -20 "$tmp/$name.log"; exit 1; }
}
compare() {  # name reference loss-tolerance grad-norm-tolerance [first step]
  local worst
  worst=$(paste <(tail -n +"${5:-1}" "$tmp/$2") "$tmp/$1" | awk '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; return d / (m > 1e-12 ? m : 1e-12) }
    { n++; x = rel($3, $1); if (x > wl) wl = x; y = rel($4, $2); if (y > wg) wg = y }
    END { printf "%d %.2e %.2e", n, wl, wg }')
  read -r n wl wg <<< "$worst"
  echo "$1 against $2: $n steps, worst relative difference: loss $wl (tolerance $3), grad norm $wg (tolerance $4)"
  [ "$n" -ge 10 ] && awk -v l="$wl" -v g="$wg" -v tl="$3" -v tg="$4" 'BEGIN { exit !(l < tl && g < tg) }' ||
    { echo "FAILED: $1"; status=1; }
}
status=0
run one 1
grep -q "fp8: the transformer blocks" "$tmp/one.log" || { echo "FAILED: no fp8 line in the log"; exit 1; }
run tp2_sp 2 parallel.tp=2 parallel.sequence_parallel=true
run pp2 2 parallel.pp=2
run first 1 checkpoint.dir="$tmp/ckpt" train.exit_interval=10
run resumed 1 checkpoint.dir="$tmp/ckpt"
grep -q "resumed from" "$tmp/resumed.log" || { echo "FAILED: no resume"; exit 1; }
# Loss within 1%: tp shards cast with their own scales, and every layout's bf16 sums differ in
# order. The grad norm within 20%: at steps 16-18 it swings (1.9 -> 4.4 -> 5.0 -> 2.3), and
# there one GPU's fp8 and bf16 runs differ by 31%, so fp8's tolerance for it is of that order
# (2 x H100, session 17's call 8: tp 2 + SP 1.06e-3 in loss, 0.128 in grad norm; pp 2 6.05e-4, 0.054). The
# resume is held to the same, and was bit-identical there. (On the CPU, with the GEMMs
# emulated, tests/cli/dp_equivalence.sh holds these layouts to 1e-2 on both.)
compare tp2_sp one 1e-2 2e-1
compare pp2 one 1e-2 2e-1
compare resumed one 1e-2 2e-1 11
run bf16 1 precision=bf16  # for the record: fp8 beside bf16
echo "loss and grad norm per step: one GPU fp8 | tp 2 + SP fp8 | pp 2 fp8 | one GPU bf16"
paste "$tmp/one" "$tmp/tp2_sp" "$tmp/pp2" "$tmp/bf16"
[ "$status" = 0 ] && echo "fp8_gpu: passed"
exit "$status"
