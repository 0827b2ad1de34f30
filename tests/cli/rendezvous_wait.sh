#!/usr/bin/env bash
# A missing rank at the start (issue 38, item 17): rank 0 of a world of 2 whose rank 1 never
# comes says who it waits for while it waits, and comm.rendezvous_timeout_s bounds the wait
# (it was 300 s of silence, whatever comm.timeout_s said). Rank 1 alone, without rank 0's
# store, says so too.
set -u
bin=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
run_rank() {  # rank port
  ME_JOB_TOKEN=rendezvous-test-0123456789abcdef0123456789abcdef RANK=$1 WORLD_SIZE=2 LOCAL_RANK=$1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$2 timeout 60 "$bin" "$here/recipes/gpt_tiny_bytes.lua" comm.rendezvous_timeout_s=3 train.iters=1 2>&1
}
failed=0
check() {  # what output regex...
  local what=$1 out=$2
  shift 2
  for re in "$@"; do
    if ! printf '%s' "$out" | tr '\n' ' ' | grep -Eq -- "$re"; then
      printf 'FAILED (%s): no /%s/ in:\n%s\n' "$what" "$re" "$out"
      failed=1
    fi
  done
}
start=$(date +%s)
out=$(run_rank 0 "$(port)"); rc=$?
check "rank 0 alone" "$out" "waiting for ranks 1 \(1 of 2 joined\)" \
  "rank 0: rank 1 did not join within [0-9.]+ s \(1 of 2 joined\): not started, or died at start \(comm.rendezvous_timeout_s"
[ "$rc" -ne 0 ] && [ "$rc" -lt 124 ] || { echo "FAILED: rank 0 alone exited $rc"; failed=1; }
out=$(run_rank 1 "$(port)"); rc=$?
check "rank 1 alone" "$out" "rank 1: waiting for rank 0's rendezvous store at 127.0.0.1:" "cannot reach the rendezvous store"
[ "$rc" -ne 0 ] && [ "$rc" -lt 124 ] || { echo "FAILED: rank 1 alone exited $rc"; failed=1; }
took=$(( $(date +%s) - start ))
[ "$took" -le 30 ] || { echo "FAILED: the two 3 s rendezvous took ${took} s"; failed=1; }
[ "$failed" = 0 ] && echo "rendezvous waits say who is missing and end after comm.rendezvous_timeout_s"
exit "$failed"
