#!/usr/bin/env bash
# Save-and-exit on Slurm's signal: a `--nproc 2` run (pipeline stages, so both ranks own state)
# gets SIGUSR1 at the launcher, which forwards it; both ranks agree on the iteration, save it,
# and the job exits with 75 (kExitRequeue, what slurm/train.sbatch requeues on). A restart
# resumes from that iteration.
set -euo pipefail
bin=$1
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
common="parallel.pp=2 schedule.decay_iters=100000"
"$bin" --nproc 2 "$script" $common train.iters=100000 checkpoint.dir="$dir" > "$tmp/run.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do grep -qs "iteration        3/" "$tmp/run.log" && break; sleep 0.05; done
kill -USR1 "$pid"
rc=0
wait "$pid" || rc=$?
pid=""
fail() { echo "FAILED: $*"; tail -20 "$tmp/run.log"; exit 1; }
[ "$rc" -eq 75 ] || fail "exit status $rc after SIGUSR1, expected 75"
line=$(grep -E "\[rank 0\] stopping: SIGUSR1 at iteration [0-9]+; a checkpoint of it was saved" "$tmp/run.log") ||
  fail "rank 0 did not say it stopped on SIGUSR1 with a checkpoint"
it=$(printf '%s' "$line" | sed -E 's/.*iteration ([0-9]+);.*/\1/')
[ "$(cat "$dir/latest_checkpointed_iteration.txt")" = "$it" ] || fail "the tracker does not name iteration $it"
# Both ranks wrote their part of that iteration.
for r in 0 1; do
  [ -f "$dir/iter_$(printf %07d "$it")/rank_0000$r.safetensors" ] || fail "rank $r's shard of iteration $it is missing"
done
"$bin" --nproc 2 "$script" $common train.iters=$((it + 2)) checkpoint.dir="$dir" > "$tmp/resume.log" 2>&1 ||
  { cat "$tmp/resume.log"; fail "the restart failed"; }
grep -q "resumed from $dir/iter_$(printf %07d "$it")" "$tmp/resume.log" || fail "the restart did not resume from iteration $it"
echo "checkpoint_signal: SIGUSR1 -> both ranks saved iteration $it, exit 75; the restart resumed from it"
