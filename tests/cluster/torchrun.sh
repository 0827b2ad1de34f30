#!/usr/bin/env bash
# Issue 40, test 6: two nodes without Slurm. The torchrun-style variables (MASTER_ADDR = node1's
# address, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, ME_JOB_TOKEN) are set by
# hand for 2 processes in node1's namespace and 2 in node2's; they train recipes/gpt_tiny.lua at
# tp 2 x dp 2 with a falling loss. Meanwhile a process in a third namespace (node3) with the
# right variables but another token tries to join as rank 3: the store refuses it, it exits
# non-zero saying so, rank 0 logs the refusal with node3's address, and the job is unaffected.
# Exits 77 (skip) where the namespaces cannot be made here.
#   torchrun.sh MEGAENGINE
set -euo pipefail
bin=$(readlink -f "$1")
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/tests/cluster/two_nodes.sh"
source "$repo/tests/cluster/checks.sh"
network_up node1 node2 node3
export ME_ASSET_DIR=${ME_ASSET_DIR:-$repo/assets}
job_token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')

rank_pids=()
start_rank() {  # NODE RANK LOCAL_RANK TOKEN LOG
  on "$1" env MASTER_ADDR="${cluster_addr[node1]}" MASTER_PORT=29500 RANK="$2" WORLD_SIZE=4 LOCAL_RANK="$3" \
    LOCAL_WORLD_SIZE=2 ME_JOB_TOKEN="$4" "$bin" "$repo/recipes/gpt_tiny.lua" parallel.tp=2 "${tiny_args[@]}" \
    >"$5" 2>&1 &
  rank_pids+=($!)
}
start_rank node1 0 0 "$job_token" rank0.log
start_rank node3 3 1 "not-this-jobs-token-$RANDOM$RANDOM" intruder.log
intruder=${rank_pids[1]}
start_rank node1 1 1 "$job_token" rank1.log
start_rank node2 2 0 "$job_token" rank2.log
start_rank node2 3 1 "$job_token" rank3.log

set +e
wait "$intruder"
intruder_rc=$?
status=0
for r in 0 1 2 3; do
  pid=${rank_pids[$((r == 0 ? 0 : r + 1))]}
  timeout 150 tail --pid="$pid" -f /dev/null
  wait "$pid" || { echo "rank $r exited $?"; status=1; }
done
set -e
[ "$status" -eq 0 ] || fail "the 4 ranks did not all finish: $(tail -n 20 rank*.log)"
check_layout rank0.log 4 "0 node1 0 0 0" "1 node1 1 0 0" "2 node2 0 1 0" "3 node2 1 1 0"
check_loss_falls rank0.log
echo "torchrun: 4 ranks on node1 + node2 trained"

[ "$intruder_rc" -ne 0 ] || fail "the process without the job token exited 0: $(cat intruder.log)"
grep -q "refused" intruder.log || fail "the process without the job token was not told it was refused: $(cat intruder.log)"
grep -q "refused.*${cluster_addr[node3]}\|${cluster_addr[node3]}.*refused" rank0.log ||
  fail "rank 0 did not log the refusal of ${cluster_addr[node3]}: $(grep -i refus rank0.log)"
echo "torchrun: node3 without the token refused (exit $intruder_rc): $(grep -m1 refused intruder.log)"
