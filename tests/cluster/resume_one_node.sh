#!/usr/bin/env bash
# Issue 40, test 4: a checkpoint written by a two-node job (tests/cluster/two_nodes.sh, tp 2 x
# dp 2 over node1 + node2, 2 tasks each) resumes on one node with another layout (2 tasks of
# node1 at pp 2): the second job says it resumed from the first's last iteration and trains on to
# its own end with a finite loss.
# Exits 77 (skip) where the cluster cannot be built here.
#   resume_one_node.sh MEGAENGINE
set -euo pipefail
bin=$(readlink -f "$1")
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/tests/cluster/two_nodes.sh"
source "$repo/tests/cluster/checks.sh"
cluster_up
export ME_ASSET_DIR=${ME_ASSET_DIR:-$repo/assets}
ckpt=$tmp/job/ckpt

id=$(ME_BIN=$bin submit save --nodes=2 --ntasks-per-node=2 "$repo/slurm/train.sbatch" "$repo/recipes/gpt_tiny.lua" \
       "${tiny_args[@]}" parallel.tp=2 checkpoint.dir="$ckpt")
wait_job "$id" 150
check_completed save "$id" "$tmp/job/logs/save-$id.out"
[ -d "$ckpt/iter_0000008" ] || fail "the two-node job wrote no checkpoint at iteration 8: $(ls -R "$ckpt" 2>&1)"

id=$(ME_BIN=$bin submit resume --nodes=1 --nodelist=node1 --ntasks-per-node=2 "$repo/slurm/train.sbatch" \
       "$repo/recipes/gpt_tiny.lua" "${tiny_args[@]}" train.iters=12 parallel.pp=2 checkpoint.dir="$ckpt")
wait_job "$id" 150
log=$tmp/job/logs/resume-$id.out
check_completed resume "$id" "$log"
grep -q "resumed from $ckpt/iter_0000008" "$log" || fail "the one-node job did not resume from iteration 8: $(cat "$log")"
check_layout "$log" 2 "0 node1 0 0 0" "1 node1 0 0 1"
l=$(losses "$log")
grep -q "^" <<<"$l" && ! grep -qiE "nan|inf" <<<"$l" || fail "no finite loss after the resume: $(echo $l)"
grep -q "iteration *12/ *12" "$log" || fail "the resumed job did not reach iteration 12: $(cat "$log")"
echo "resume_one_node: tp 2 x dp 2 on two nodes -> pp 2 on node1, resumed at 8, losses $(echo $l)"
