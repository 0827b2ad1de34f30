#!/usr/bin/env bash
# What the trainer watches (engine/train/trainer_health.cpp), provoked through its test
# facilities:
# 1. ME_TEST_NAN_AT=5:1 under train.nan_policy = skip (the default), --nproc 2 with pipeline
#    stages: step 5 is skipped and counted, the warning names the parameter and rank 1.
# 2. Under nan_policy = stop with max_consecutive_nan = 1 and a checkpoint.dir: the run saves
#    iteration 5 and exits 65 (kExitNonFinite) saying what to try.
# 3. ME_TEST_SLOW_RANK=3:500 in a --nproc 4 run: rank 3 is named a straggler within two log
#    intervals. The sleep is several times a step's compute even on a loaded 2-core machine
#    (4 ranks sharing 2 cores take ~100-200 ms a step); at 60 ms, CI once saw the other ranks'
#    contended compute outweigh rank 3's sleep plus its uncontended compute.
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
script=$here/lua/train_parallel.lua
fail() { echo "FAILED: $1"; tail -15 "$2"; exit 1; }

rc=0
ME_TEST_NAN_AT=5:1 timeout 120 "$bin" --nproc 2 "$script" parallel.pp=2 > "$tmp/skip.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "skip: exit $rc" "$tmp/skip.log"
grep -q "iteration 5: the gradient norm is nan; the first non-finite gradient is final_norm.bias on rank 1" "$tmp/skip.log" ||
  fail "skip: no report naming final_norm.bias on rank 1" "$tmp/skip.log"
grep -Eq "iteration +5/ +20 .*grad norm: nan \| number of skipped iterations: +1 \| number of nan iterations: +1" "$tmp/skip.log" ||
  fail "skip: step 5 not counted as skipped and nan" "$tmp/skip.log"
grep -Eq "iteration +20/ +20 " "$tmp/skip.log" || fail "skip: the run did not go on to 20" "$tmp/skip.log"
echo "ok nan skip: $(grep -o 'iteration 5: the gradient norm is nan; the first non-finite gradient is [^;]*' "$tmp/skip.log" | head -1)"

rc=0
ME_TEST_NAN_AT=5:1 timeout 120 "$bin" --nproc 2 "$script" parallel.pp=2 train.nan_policy=stop train.max_consecutive_nan=1 \
  checkpoint.dir="$tmp/ckpt" > "$tmp/stop.log" 2>&1 || rc=$?
[ "$rc" -eq 65 ] || fail "stop: exit $rc, expected 65" "$tmp/stop.log"
grep -q "training stopped: 1 steps in a row with a non-finite gradient at iteration 5 (train.nan_policy = \"stop\"). What usually helps: a lower optimizer.lr" "$tmp/stop.log" ||
  fail "stop: no message saying what to try" "$tmp/stop.log"
[ "$(cat "$tmp/ckpt/latest_checkpointed_iteration.txt")" = 5 ] || fail "stop: no checkpoint of iteration 5" "$tmp/stop.log"
echo "ok nan stop: exit 65, iteration 5 saved"

rc=0
ME_TEST_SLOW_RANK=3:500 timeout 180 "$bin" --nproc 4 "$script" train.log_interval=4 train.iters=8 > "$tmp/slow.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "straggler: exit $rc" "$tmp/slow.log"
grep -q "straggler: rank 3 (" "$tmp/slow.log" || fail "straggler: rank 3 not named within two log intervals" "$tmp/slow.log"
echo "ok straggler: $(grep -o 'straggler: rank 3 ([^)]*) takes [0-9.]* ms of its own per step, [0-9.]*x the median' "$tmp/slow.log" | head -1)"
echo "health: all passed"
