#!/usr/bin/env bash
# Kill test: training with a save every iteration (async), its writer slowed down
# (ME_TEST_CHECKPOINT_SLOW_MS: a sleep after each MiB, a test facility) so that the SIGKILL,
# sent at a random moment, often lands inside a write. After each kill a restart must resume
# from exactly the iteration the tracker named at the kill (never from a partial save) and
# train on. Usage: checkpoint_kill.sh MEGAENGINE [ROUNDS (default 3)]
set -euo pipefail
bin=$1
rounds=${2:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
pid=""
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
script=$here/lua/train_parallel.lua
dir=$tmp/ckpt
# A model big enough that a shard takes a while to write (about 12 MB, 1 MiB per 15 ms).
model="model.hidden=256 model.layers=4 model.heads=4 schedule.decay_iters=100000"
passed=0
for round in $(seq 1 "$rounds"); do
  ME_TEST_CHECKPOINT_SLOW_MS=15 "$bin" "$script" $model train.iters=100000 train.log_interval=1 \
    checkpoint.dir="$dir" checkpoint.interval=1 > "$tmp/run$round.log" 2>&1 &
  pid=$!
  # Until the first checkpoint is on its way, then a random moment within about 3 s.
  for _ in $(seq 1 200); do grep -qs "checkpoint iteration" "$tmp/run$round.log" && break; sleep 0.05; done
  sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", rand() * 3 }')"
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
  latest=$(cat "$dir/latest_checkpointed_iteration.txt" 2>/dev/null || echo none)
  leftovers=$(ls "$dir" | grep -c '\.tmp-' || true)
  # The restart: two more iterations from wherever the tracker points.
  target=$(( ${latest/none/0} + 2 ))
  if ! timeout 120 "$bin" "$script" $model train.iters=$target checkpoint.dir="$dir" > "$tmp/restart$round.log" 2>&1; then
    echo "FAILED: round $round: the restart after the kill failed:"
    tail -15 "$tmp/restart$round.log"
    exit 1
  fi
  if [ "$latest" = none ]; then
    grep -q "resumed from" "$tmp/restart$round.log" && { echo "FAILED: round $round resumed without a tracker"; exit 1; }
  else
    grep -q "resumed from $dir/iter_$(printf %07d "$latest")" "$tmp/restart$round.log" ||
      { echo "FAILED: round $round: did not resume from iteration $latest:"; grep -E "resumed|megaengine:" "$tmp/restart$round.log"; exit 1; }
  fi
  [ "$leftovers" -gt 0 ] && ! grep -q "left by a save that did not finish" "$tmp/restart$round.log" &&
    { echo "FAILED: round $round: $leftovers partial saves were not cleaned up"; exit 1; }
  if [ "$latest" = none ]; then how="started afresh (no save had committed)"; else how="resumed from iteration $latest"; fi
  echo "round $round: killed with $leftovers partial save(s) in flight; the restart $how and trained to $target"
  passed=$((passed + 1))
done
echo "checkpoint_kill: $passed of $rounds rounds passed"
