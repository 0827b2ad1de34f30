#!/usr/bin/env bash
# Issue 40, test 1: slurm/train.sbatch on two nodes (tests/cluster/two_nodes.sh), 2 tasks each,
# recipes/gpt_tiny.lua at tp 2: the job completes with a falling loss, the layout table puts
# each tp group inside a node and dp across the nodes, and every rank's host column names the
# node Slurm ran it on (block distribution: ranks 0-1 on node1, 2-3 on node2).
# Exits 77 (skip) where the cluster cannot be built here.
#   train_tp.sh MEGAENGINE
set -euo pipefail
bin=$(readlink -f "$1")
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/tests/cluster/two_nodes.sh"
source "$repo/tests/cluster/checks.sh"
cluster_up
export ME_ASSET_DIR=${ME_ASSET_DIR:-$repo/assets}

t0=$(date +%s)
id=$(ME_BIN=$bin submit train --nodes=2 --ntasks-per-node=2 "$repo/slurm/train.sbatch" "$repo/recipes/gpt_tiny.lua" \
       parallel.tp=2 "${tiny_args[@]}")
wait_job "$id" 150
log=$tmp/job/logs/train-$id.out
check_completed train "$id" "$log"
check_layout "$log" 4 "0 node1 0 0 0" "1 node1 1 0 0" "2 node2 0 1 0" "3 node2 1 1 0"
check_loss_falls "$log"
echo "train_tp: job $id on node1+node2 at tp 2 x dp 2 COMPLETED in $(( $(date +%s) - t0 )) s"
