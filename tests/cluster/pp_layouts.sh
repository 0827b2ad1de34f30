#!/usr/bin/env bash
# Issue 40, test 2: pipeline parallelism across the two nodes of tests/cluster/two_nodes.sh.
# slurm/train.sbatch with 2 tasks per node trains recipes/gpt_tiny.lua at
#   pp 2 (x dp 2): each node holds one stage, its two ranks the data-parallel replicas;
#   tp 2 x pp 2:   each node holds one stage, split over its two ranks;
# with the layout table saying so, and the same losses, digit for digit, as the same layout run
# on one host (`megaengine --nproc 4`, loopback).
# Exits 77 (skip) where the cluster cannot be built here.
#   pp_layouts.sh MEGAENGINE
set -euo pipefail
bin=$(readlink -f "$1")
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/tests/cluster/two_nodes.sh"
source "$repo/tests/cluster/checks.sh"
cluster_up
export ME_ASSET_DIR=${ME_ASSET_DIR:-$repo/assets}

layout_run() {  # NAME ROWS OVERRIDES...: the two-node job against the one-host run
  local name=$1 rows=$2 id log
  shift 2
  id=$(ME_BIN=$bin submit "$name" --nodes=2 --ntasks-per-node=2 "$repo/slurm/train.sbatch" \
         "$repo/recipes/gpt_tiny.lua" "${tiny_args[@]}" "$@")
  wait_job "$id" 150
  log=$tmp/job/logs/$name-$id.out
  check_completed "$name" "$id" "$log"
  IFS=, read -ra row_list <<<"$rows"  # ROWS: "RANK HOST TP DP PP,..."
  check_layout "$log" 4 "${row_list[@]}"
  check_loss_falls "$log"
  "$bin" --nproc 4 "$repo/recipes/gpt_tiny.lua" "${tiny_args[@]}" "$@" >"$tmp/$name-one-host.log" 2>&1 ||
    fail "$name: the one-host run failed: $(tail -n 20 "$tmp/$name-one-host.log")"
  [ "$(losses "$log")" = "$(losses "$tmp/$name-one-host.log")" ] ||
    fail "$name: the two-node losses differ from one host's:"$'\n'"$(paste <(losses "$log") <(losses "$tmp/$name-one-host.log"))"
  echo "$name: job $id on two nodes, the same losses as on one host"
}
layout_run pp2 "0 node1 0 0 0,1 node1 0 1 0,2 node2 0 0 1,3 node2 0 1 1" parallel.pp=2
layout_run tp2_pp2 "0 node1 0 0 0,1 node1 1 0 0,2 node2 0 0 1,3 node2 1 0 1" parallel.tp=2 parallel.pp=2
echo "pp_layouts: all checks passed"
