#!/usr/bin/env bash
# The slurm/ scripts against a real Slurm: munged, slurmctld and slurmd on this machine (one node,
# localhost), everything under a temp dir, then
#   1. sbatch --wait slurm/train.sbatch with 2 tasks of a tiny CPU recipe: the job ends COMPLETED
#      and both tasks log a falling loss in one data-parallel world of 2;
#   2. the requeue path: ME_BIN is a wrapper that exits with ME_EXIT_REQUEUE on the first run,
#      as megaengine does after a checkpoint on SIGUSR1; the job must come back (restart 1) and
#      complete;
#   3. slurm/preprocess.sbatch (GPT-2 tokens) and slurm/doctor.sbatch (one task per node).
# Exits 77 (CTest's SKIP_RETURN_CODE) without root, without the packages (scripts/setup.sh
# installs slurm-wlm and munge), or when the daemons cannot start here; says why.
#   slurm_job.sh MEGAENGINE
set -euo pipefail
bin=$(readlink -f "$1")
repo=$(cd "$(dirname "$0")/../.." && pwd)
source "$repo/tests/cluster/slurm_common.sh"
slurm_require
slurm_init slurm

# Two adjacent free TCP ports (not in /proc/net/tcp{,6}) in 25000-29999: below Linux's ephemeral
# range, and above the rendezvous ports train.sbatch derives from small job ids (20000 + id).
port_in_use() {  # any local socket on that port, listening or not (column 2 is ADDR:PORT in hex)
  awk 'FNR > 1 {print $2}' /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -qi ":$(printf %04X "$1")\$"
}
free_port_pair() {
  local p
  for _ in $(seq 200); do
    p=$((25000 + RANDOM % 4999))
    port_in_use "$p" || port_in_use $((p + 1)) || { echo "$p"; return; }
  done
  echo "no free TCP port pair found" >&2
  exit 1
}

node=$(hostname -s 2>/dev/null || uname -n)
node=${node%%.*}
cpus=$(nproc)
[ "$cpus" -ge 2 ] || cpus=2  # the node claims 2 CPUs even on one core (SlurmdParameters=config_overrides)
port=$(free_port_pair)
start_munged
{
  slurm_conf_common "$node" 127.0.0.1 "$port" $((port + 1))
  echo "NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node CPUs=$cpus State=UNKNOWN"
  echo "PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP"
} >"$tmp/slurm.conf"
export SLURM_CONF=$tmp/slurm.conf

env "$token" slurmctld -D -i -f "$SLURM_CONF" >"$tmp/log/slurmctld.out.log" 2>&1 &
daemon_pids+=($!)
env "$token" slurmd -D -f "$SLURM_CONF" -N "$node" >"$tmp/log/slurmd.out.log" 2>&1 &
daemon_pids+=($!)
wait_idle "$node"
echo "slurm: node $node idle ($cpus CPUs), slurmctld port $port"

# Jobs run from a directory of their own, as a user submits from one: logs/ is there.
cd "$tmp/job"
export ME_ASSET_DIR=${ME_ASSET_DIR:-$repo/assets}
# --time=10: more than train.sbatch's --signal=USR1@300, which would otherwise come at once.
submit() {  # NAME SBATCH-ARGS... -> the job id, at once
  env "$token" sbatch --parsable --job-name="$1" --nodes=1 --gpus-per-node=0 --time=10 "${@:2}" | cut -d';' -f1
}
falls() {  # TASK LOG: task's hook losses, the last below the first
  local losses
  losses=$(grep -o "slurm_tiny: task $1 of 2: iteration [0-9]* lm loss: [-0-9.E+]*" "$2" | awk '{print $NF}')
  [ "$(echo "$losses" | wc -w)" -ge 3 ] || fail "task $1 logged $(echo "$losses" | wc -w) losses, expected 4: $(cat "$2")"
  echo "$losses" | awk 'NR==1{first=$1} {last=$1} END{exit !(last < first)}' ||
    fail "task $1's loss did not fall: $(echo $losses)"
  echo "task $1 losses: $(echo $losses)"
}
train_args=("$repo/tests/cli/slurm_tiny.lua" train.iters=20 train.log_interval=5 train.eval_iters=0
            sample.tokens=0 model.layers=2 model.hidden=64 model.seq=64 batch.micro=8 schedule.warmup_iters=2
            comm.timeout_s=60)

# ---- 1. train.sbatch: 2 tasks, falling loss on both ----------------------------------------------
t0=$(date +%s)
set +e
ME_BIN=$bin env "$token" sbatch --wait --parsable --job-name=train --nodes=1 --ntasks-per-node=2 --gpus-per-node=0 \
  --time=10 "$repo/slurm/train.sbatch" "${train_args[@]}" >"$tmp/train.id" 2>"$tmp/train.err"
rc=$?
set -e
id=$(cut -d';' -f1 "$tmp/train.id")
log=$tmp/job/logs/train-$id.out
[ "$rc" -eq 0 ] || fail "sbatch --wait slurm/train.sbatch exited $rc: $(cat "$tmp/train.err" "$log" 2>/dev/null)"
check_completed train "$id" "$log"
grep -q "world 2 = tp 1 x cp 1 x dp 2 x pp 1" "$log" || fail "the 2 tasks did not form one world of 2: $(cat "$log")"
grep -q "lm loss: " "$log" || fail "no progress line in $log"
falls 0 "$log"
falls 1 "$log"
[ "$(grep -o 'task 0 of 2: .*' "$log" | sed 's/task 0/task X/')" = "$(grep -o 'task 1 of 2: .*' "$log" | sed 's/task 1/task X/')" ] ||
  fail "the tasks logged different losses: one data-parallel world has one global-batch loss"
grep -q "train.sbatch: job $id (restart 0)" "$log" || fail "no start line in $log"
echo "train.sbatch: job $id COMPLETED in $(( $(date +%s) - t0 )) s"

# ---- 2. requeue on ME_EXIT_REQUEUE ---------------------------------------------------------------
cat >"$tmp/requeue_bin.sh" <<EOF
#!/bin/bash
# The first run stops as megaengine does after a checkpoint on SIGUSR1; the requeued run trains.
if [ "\${SLURM_RESTART_COUNT:-0}" = 0 ]; then echo "requeue_bin: task \$SLURM_PROCID stops with 75"; exit 75; fi
exec "$bin" "\$@"
EOF
chmod +x "$tmp/requeue_bin.sh"
t0=$(date +%s)
id=$(ME_BIN=$tmp/requeue_bin.sh submit requeue --ntasks-per-node=2 "$repo/slurm/train.sbatch" "${train_args[@]}")
wait_job "$id"
log=$tmp/job/logs/requeue-$id.out
check_completed requeue "$id" "$log"
grep -q "requeueing job $id" "$log" || fail "requeue: the first run did not requeue: $(cat "$log")"
grep -q "train.sbatch: job $id (restart 1)" "$log" || fail "requeue: no second run: $(cat "$log")"
falls 0 "$log"
echo "train.sbatch requeue: job $id stopped with 75, came back and COMPLETED in $(( $(date +%s) - t0 )) s"

# ---- 3. preprocess.sbatch and doctor.sbatch ------------------------------------------------------
printf '{"text": "Call me Ishmael."}\n{"text": "Some years ago, never mind how long precisely."}\n' >"$tmp/job/in.jsonl"
id=$(ME_BIN=$bin submit preprocess "$repo/slurm/preprocess.sbatch" --input in.jsonl --output-prefix out \
       --tokenizer gpt2 --append-eod)
wait_job "$id"
log=$tmp/job/logs/preprocess-$id.out
check_completed preprocess "$id" "$log"
grep -q "2 documents" "$log" && [ -s out_text_document.bin ] && [ -s out_text_document.idx ] ||
  fail "preprocess: no .bin/.idx: $(cat "$log")"
id=$(ME_BIN=$bin ME_DOCTOR_PATHS=$tmp/job submit doctor "$repo/slurm/doctor.sbatch")
wait_job "$id"
log=$tmp/job/logs/doctor-$id.out
check_completed doctor "$id" "$log"
grep -q "doctor: .* passed, 0 failed" "$log" || fail "doctor: $(cat "$log")"
echo "slurm_job: all checks passed"
