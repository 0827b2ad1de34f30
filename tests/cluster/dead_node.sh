#!/usr/bin/env bash
# Issue 40, test 3: a dead node. slurm/train.sbatch trains on node1 + node2 (2 tasks each, dp 4);
# once it is training, every process of node2's namespace is killed at once (slurmd, slurmstepd,
# the ranks), as when a node loses power. Then:
#   - the job ends within comm.dead_after_s plus a margin (train.sbatch's ME_SRUN_WAIT and
#     Slurm's KillWait), not after Slurm's SlurmdTimeout (30 s here, minutes on clusters) nor
#     the collective timeout;
#   - the log names node2 and its ranks 2 and 3 as dead;
#   - nothing of the job stays running on node1 (no rank, no slurmstepd).
# Exits 77 (skip) where the cluster cannot be built here.
#   dead_node.sh MEGAENGINE
set -euo pipefail
bin=$(readlink -f "$1")
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/tests/cluster/two_nodes.sh"
source "$repo/tests/cluster/checks.sh"
cluster_up
export ME_ASSET_DIR=${ME_ASSET_DIR:-$repo/assets}
dead_after=6
srun_wait=4
# After the survivors exit: train.sbatch's srun --wait (ME_SRUN_WAIT), then Slurm's KillWait + 2
# for the dead node's tasks (the fixture's KillWait is 5), then a few seconds of slack.
margin=$((srun_wait + 7 + 8))

id=$(ME_BIN=$bin ME_SRUN_WAIT=$srun_wait submit dead --nodes=2 --ntasks-per-node=2 "$repo/slurm/train.sbatch" "$repo/recipes/gpt_tiny.lua" \
       "${tiny_args[@]}" train.iters=100000 comm.dead_after_s=$dead_after comm.heartbeat_s=1)
log=$tmp/job/logs/dead-$id.out
for _ in $(seq 600); do
  [ "$(losses "$log" 2>/dev/null | wc -l)" -ge 2 ] && break
  # Only a final state counts: a job also passes through CONFIGURING, and scontrol can answer
  # nothing for a moment on a loaded machine.
  case "$(job_state "$id")" in
    COMPLETED | FAILED | CANCELLED* | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
      fail "job $id ended ($(job_state "$id")) before training: $(cat "$log")" ;;
  esac
  sleep 0.2
done
[ "$(losses "$log" | wc -l)" -ge 2 ] || fail "job $id did not start training within 120 s: $(cat "$log")"
kill_node node2
t0=$(date +%s.%N)
wait_job "$id" $((dead_after + margin)) completing
took=$(awk -v a="$t0" -v b="$(date +%s.%N)" "BEGIN{printf \"%.1f\", b - a}")
state=$(job_state "$id")
echo "dead_node: job $id ended $state ${took} s after node2 died (comm.dead_after_s = $dead_after, margin $margin s)"
[ "$state" != COMPLETED ] || fail "the job COMPLETED with node2 dead"
# The survivors see it through their heartbeat watchdog (after dead_after_s) or, first, through
# a collective that failed (a killed process's connections close); either names the node.
msg=$(grep -E "node node2 \(ranks 2, 3, all of its ranks in the job\)" "$log" | head -n 1)
[ -n "$msg" ] || fail "no line names node2 with its ranks 2 and 3: $(grep -iE "dead|heartbeat|error" "$log")"
echo "message: $msg"
# What is left in node1's namespace: slurmd only (the job's slurmstepd and ranks have gone).
for _ in $(seq 50); do
  left=$(for p in $(node_pids node1); do cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) && echo "$p $cmd"; done |
         grep -v " *slurmd -D" || true)
  [ -z "$left" ] && break
  sleep 0.2
done
[ -z "$left" ] || fail "still running on node1 after the job ended:"$'\n'"$left"
echo "dead_node: nothing of job $id left on node1"
