#!/usr/bin/env bash
# Issue 40, test 5: slurm/doctor.sbatch on both nodes of tests/cluster/two_nodes.sh: one task per
# node, each reports its own checks (--label prefixes 0: and 1:) as rank 0 or 1 of 2, alone on
# its node, and both pass. Then --json: one file per node, named by Slurm after the node.
# Exits 77 (skip) where the cluster cannot be built here.
#   doctor.sh MEGAENGINE
set -euo pipefail
bin=$(readlink -f "$1")
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/tests/cluster/two_nodes.sh"
cluster_up

id=$(ME_BIN=$bin ME_DOCTOR_PATHS=$tmp/job submit doctor --nodes=2 "$repo/slurm/doctor.sbatch")
wait_job "$id" 120
log=$tmp/job/logs/doctor-$id.out
check_completed doctor "$id" "$log"
for task in 0 1; do
  grep -q "^ *$task: .*doctor: .* passed, 0 failed" "$log" || fail "task $task (node$((task + 1))) reported no passing summary: $(cat "$log")"
  grep -q "^ *$task: launch: *rank $task/2 (local 0/1)" "$log" || fail "task $task is not rank $task of 2, alone on its node: $(cat "$log")"
done
echo "doctor: both nodes reported: $(grep "doctor: .* passed" "$log" | tr '\n' ';')"

id=$(ME_BIN=$bin ME_DOCTOR_PATHS=$tmp/job submit doctor_json --nodes=2 "$repo/slurm/doctor.sbatch" --json)
wait_job "$id" 120
check_completed doctor_json "$id" "$tmp/job/logs/doctor_json-$id.out"
for node in node1 node2; do
  f=$tmp/job/logs/doctor-$id-$node.json
  [ -s "$f" ] && grep -q '"failed": 0' "$f" || fail "no passing JSON report for $node in $f: $(ls "$tmp/job/logs"; cat "$f" 2>/dev/null)"
done
echo "doctor: a JSON report from each node"
