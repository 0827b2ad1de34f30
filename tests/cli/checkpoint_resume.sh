#!/usr/bin/env bash
# Checkpoints on real processes (Gloo on loopback), fp32, the equivalence recipe of
# tests/lua/train_parallel.lua (20 steps, every step's loss logged):
# 1. Exact resume, for one process, tp=2 x dp=2 with the distributed optimizer, pp=2 x dp=2 and
#    fp8 at tp=2 with sequence parallelism (its scales resumed):
#    20 steps uninterrupted; separately 10 steps (train.exit_interval saves and stops), then a new
#    run that resumes and trains to 20. Steps 11-20 print identical losses.
# 2. Resharding: saved at iteration 10 in one layout (checkpoint.interval, the run going on to
#    15), loaded in another; the next 5 steps' losses match the original layout's own
#    continuation, that same run's steps 11-15, within 1e-5 relative:
#    tp=2 x pp=2 x dp=2 (distributed optimizer) -> one process, the reverse, dp=2 -> dp=4.
#    (Saving at the interval and going on must leave the run as it was: a save that changed the
#    state would show here as a difference. Saving on exit at train.exit_interval is part 1's.)
# Usage: checkpoint_resume.sh MEGAENGINE [exact|reshard|all]
set -euo pipefail
bin=$1
what=${2:-all}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
script=$here/lua/train_parallel.lua

run() {  # name nproc overrides...: losses in $tmp/name.loss, output in $tmp/name.log
  local name=$1 nproc=$2
  shift 2
  local launch=()
  [ "$nproc" -gt 1 ] && launch=(--nproc "$nproc")
  if ! ME_LOSS_FILE=$tmp/$name.loss timeout 300 "$bin" "${launch[@]}" "$script" "$@" > "$tmp/$name.log" 2>&1; then
    echo "FAILED: run $name ($*) exited non-zero:"
    tail -20 "$tmp/$name.log"
    exit 1
  fi
}

expect_resumed() {  # name dir iteration
  grep -q "resumed from $2/iter_$(printf %07d "$3")" "$tmp/$1.log" ||
    { echo "FAILED: $1 did not resume from $2 at iteration $3:"; tail -20 "$tmp/$1.log"; exit 1; }
}

exact() {  # name nproc overrides...
  local name=$1 nproc=$2
  shift 2
  run "${name}_full" "$nproc" "$@"
  run "${name}_first" "$nproc" "$@" checkpoint.dir="$tmp/$name" train.exit_interval=10
  run "${name}_resumed" "$nproc" "$@" checkpoint.dir="$tmp/$name"
  expect_resumed "${name}_resumed" "$tmp/$name" 10
  if ! diff <(tail -n 10 "$tmp/${name}_full.loss") "$tmp/${name}_resumed.loss" > "$tmp/$name.diff"; then
    echo "FAILED: $name: steps 11-20 differ after the resume (loss, grad norm):"
    cat "$tmp/$name.diff"
    exit 1
  fi
  echo "exact resume $name: steps 11-20 identical ($(wc -l < "$tmp/${name}_resumed.loss") steps after iteration 10)"
}

reshard() {  # name from_nproc "from overrides" to_nproc "to overrides"
  local name=$1 from_n=$2 from=$3 to_n=$4 to=$5
  # shellcheck disable=SC2086  # the override lists are word lists
  run "${name}_continue" "$from_n" $from checkpoint.dir="$tmp/$name" checkpoint.interval=10 \
    train.exit_interval=15 checkpoint.save_on_exit=false
  [ -d "$tmp/$name/iter_0000010" ] && [ ! -e "$tmp/$name/iter_0000015" ] ||
    { echo "FAILED: $name: expected one checkpoint, iter_0000010, in $tmp/$name:"; ls "$tmp/$name"; exit 1; }
  # shellcheck disable=SC2086
  run "${name}_load" "$to_n" $to checkpoint.dir="$tmp/$name" train.exit_interval=15 checkpoint.save_on_exit=false
  expect_resumed "${name}_load" "$tmp/$name" 10
  local worst
  worst=$(paste <(tail -n 5 "$tmp/${name}_continue.loss") "$tmp/${name}_load.loss" | awk '
    function rel(a, b) { d = a - b; if (d < 0) d = -d; m = a < 0 ? -a : a; return d / (m > 1e-12 ? m : 1e-12) }
    { n++; x = rel($1, $3); if (x > w) w = x; y = rel($2, $4); if (y > w) w = y }
    END { if (n != 5) { print "steps=" n; exit } printf "%.2e", w }')
  echo "reshard $name: 5 steps after loading, worst relative difference to the original layout (loss, grad norm): $worst"
  case $worst in
    steps=*) echo "FAILED: $name logged $worst, expected 5"; exit 1 ;;
  esac
  awk -v w="$worst" 'BEGIN { exit !(w < 1e-5) }' || { echo "FAILED: $name differs by $worst (tolerance 1e-5)"; exit 1; }
}

if [ "$what" = exact ] || [ "$what" = all ]; then
  exact one 1
  exact tp2_dp2_distopt 4 parallel.tp=2 parallel.distributed_optimizer=true
  exact pp2_dp2 4 parallel.pp=2
  # fp8 (its GEMMs emulated on the CPU): the scales and amax histories resume with the weights
  ME_TEST_FP8_EMULATED=1 exact fp8_tp2_sp 2 precision=fp8 parallel.tp=2 parallel.sequence_parallel=true
fi
if [ "$what" = reshard ] || [ "$what" = all ]; then
  big="parallel.tp=2 parallel.pp=2 parallel.distributed_optimizer=true"
  reshard tp2_pp2_dp2_to_one 8 "$big" 1 ""
  reshard one_to_tp2_pp2_dp2 1 "" 8 "$big"
  reshard dp2_to_dp4 2 "parallel.distributed_optimizer=true" 4 "parallel.distributed_optimizer=true"
fi
echo "checkpoint_resume: all passed"
