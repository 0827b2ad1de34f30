#!/usr/bin/env bash
# The 4-process tensor-parallel test (cli.tp_matches_tp1) RUNS times in a row while other
# multi-process runs go on beside it, as under `ctest -j2` on a 2-core machine; stops at the
# first failure and prints its output. Not part of CI (minutes); run it under the build lock:
#   flock /tmp/me-cpu.lock bash tests/cli/stress_tp.sh build/megaengine [RUNS]
# The neighbour loops through test_comm.lua (4 ranks), a 2-rank sequence-parallel training run
# and a 4-rank tensor x pipeline training run, each started right after the previous one ends.
set -uo pipefail
bin=$(realpath "$1")
runs=${2:-30}
here=$(cd "$(dirname "$0")/.." && pwd)
repo=$(cd "$here/.." && pwd)
tmp=$(mktemp -d)
neighbour_pid=
cleanup() {
  [ -n "$neighbour_pid" ] && kill "$neighbour_pid" 2>/dev/null && wait "$neighbour_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
cd "$repo"
export ME_ASSET_DIR=${ME_ASSET_DIR:-$repo/assets}

neighbour() {
  local n=0
  while [ ! -e "$tmp/stop" ]; do
    case $((n % 3)) in
      0) "$bin" --nproc 4 "$here/lua/test_comm.lua" ;;
      1) "$bin" --nproc 2 recipes/gpt_tiny_bytes.lua parallel.tp=2 parallel.sequence_parallel=true train.iters=4 \
           schedule.warmup_iters=1 train.eval_iters=0 sample.tokens=0 ;;
      2) "$bin" --nproc 4 recipes/gpt_tiny_bytes.lua parallel.tp=2 parallel.pp=2 model.layers=2 train.iters=4 \
           schedule.warmup_iters=1 train.eval_iters=0 sample.tokens=0 ;;
    esac > "$tmp/neighbour.log" 2>&1 || { echo "(neighbour run $n failed: $(tail -1 "$tmp/neighbour.log"))"; }
    n=$((n + 1))
    echo $n > "$tmp/neighbour_runs"
  done
}
neighbour &
neighbour_pid=$!

passed=0
start=$SECONDS
for i in $(seq 1 "$runs"); do
  if ! bash "$here/cli/expect.sh" ok "worst relative error [0-9.e-]+; test_tp passed" -- \
      "$bin" --nproc 4 "$here/lua/test_tp.lua" > "$tmp/run.log" 2>&1; then
    echo "stress_tp: run $i FAILED after $passed passes:"
    cat "$tmp/run.log"
    touch "$tmp/stop"
    exit 1
  fi
  passed=$((passed + 1))
done
touch "$tmp/stop"
wait "$neighbour_pid"
neighbour_pid=
echo "stress_tp: $passed of $runs runs of test_tp.lua (--nproc 4) passed in a row in $((SECONDS - start)) s," \
     "beside $(cat "$tmp/neighbour_runs" 2>/dev/null || echo 0) multi-process neighbour runs"
