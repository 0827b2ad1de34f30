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
export PATH=$PATH:/usr/sbin:/sbin
bin=$(readlink -f "$1")
repo=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAILED: $*"; dump_logs; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "needs root: slurmd starts jobs and munged/slurmctld run as SlurmUser=root here"
for p in munged slurmctld slurmd sbatch sinfo scontrol od; do
  command -v "$p" >/dev/null || skip "$p is not installed (scripts/setup.sh installs Debian's slurm-wlm and munge)"
done

tmp=$(mktemp -d /tmp/me-slurm.XXXXXX)
chmod 700 "$tmp"
# The daemons and sbatch get this variable, and everything they start (slurmstepd, the ranks)
# inherits it, so the cleanup finds exactly them and nothing else on the machine.
token="ME_SLURM_TEST_TOKEN=me-slurm-test-$$-$RANDOM$RANDOM"
daemon_pids=()
cleanup() {
  set +e
  [ -n "${SLURM_CONF:-}" ] && scancel --quiet --full --user=root 2>/dev/null
  for pid in "${daemon_pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=$(grep -lzx "$token" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3)
    [ -z "$alive" ] && break
    sleep 0.1
  done
  [ -n "$alive" ] && kill -KILL $alive 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

dump_logs() {
  for f in "$tmp"/log/*.log "$tmp"/job/logs/*; do
    [ -f "$f" ] && { echo "--- $f (last 40 lines)"; tail -n 40 "$f"; }
  done
}

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
mkdir -p "$tmp"/{munge,state,spool,log,job/logs}
chmod 700 "$tmp/munge"

# ---- munge: its own key and socket, nothing under /etc or /run ---------------------------------
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
env "$token" munged --foreground --force --socket="$tmp/munge/munge.socket" --key-file="$tmp/munge/munge.key" \
  --log-file="$tmp/log/munged.log" --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munged.seed" \
  >"$tmp/log/munged.out.log" 2>&1 &
daemon_pids+=($!)

cat >"$tmp/slurm.conf" <<EOF
ClusterName=metest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
JobCompType=jobcomp/filetxt
JobCompLoc=$tmp/log/jobcomp.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=600
KillWait=5
InactiveLimit=0
NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$tmp/slurm.conf

for _ in $(seq 50); do [ -S "$tmp/munge/munge.socket" ] && break; sleep 0.1; done
[ -S "$tmp/munge/munge.socket" ] || skip "munged did not start here: $(tail -n 3 "$tmp/log/munged.out.log" "$tmp/log/munged.log" 2>/dev/null | tr '\n' ' ')"

env "$token" slurmctld -D -i -f "$SLURM_CONF" >"$tmp/log/slurmctld.out.log" 2>&1 &
daemon_pids+=($!)
env "$token" slurmd -D -f "$SLURM_CONF" -N "$node" >"$tmp/log/slurmd.out.log" 2>&1 &
daemon_pids+=($!)

state=""
for _ in $(seq 150); do
  state=$(sinfo -h -N -n "$node" -o %t 2>/dev/null || true)
  [ "$state" = idle ] && break
  for pid in "${daemon_pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || skip "a Slurm daemon exited at start: $(tail -n 5 "$tmp"/log/slurm*.log 2>/dev/null | tr '\n' ' ')"
  done
  sleep 0.2
done
[ "$state" = idle ] || skip "node $node is not idle after 30 s (state '$state'): $(tail -n 5 "$tmp"/log/slurm*.log | tr '\n' ' ')"
echo "slurm: node $node idle ($cpus CPUs), slurmctld port $port"

# Jobs run from a directory of their own, as a user submits from one: logs/ is there.
cd "$tmp/job"
export ME_ASSET_DIR=${ME_ASSET_DIR:-$repo/assets}
# --time=10: more than train.sbatch's --signal=USR1@300, which would otherwise come at once.
submit() {  # NAME SBATCH-ARGS... -> the job id, at once
  env "$token" sbatch --parsable --job-name="$1" --nodes=1 --gpus-per-node=0 --time=10 "${@:2}" | cut -d';' -f1
}
job_state() {  # the final state slurmctld recorded (jobcomp), else what scontrol still shows
  local s
  s=$(grep -o "JobId=$1 .*JobState=[A-Z_]*" "$tmp/log/jobcomp.log" 2>/dev/null | tail -n 1 | sed 's/.*JobState=//')
  [ -n "$s" ] || s=$(scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
  echo "$s"
}
wait_job() {  # ID: polls until the job has ended. Slurm holds a requeued job for 2 minutes
  local info state  # (Reason=BeginTime); the test lifts that hold at once.
  for _ in $(seq 600); do
    info=$(scontrol show job "$1" 2>/dev/null || true)
    state=$(grep -o 'JobState=[A-Z_]*' <<<"$info" | cut -d= -f2)
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) return ;;
      PENDING) grep -q 'Reason=BeginTime' <<<"$info" && scontrol update JobId="$1" StartTime=now ;;
    esac
    sleep 0.3
  done
  fail "job $1 still $state after 180 s"
}
check_completed() {  # NAME JOBID LOG
  local state
  state=$(job_state "$2")
  [ "$state" = COMPLETED ] || fail "$1: job $2 ended $state, not COMPLETED: $(cat "$3" 2>/dev/null)"
  [ -s "$3" ] || fail "$1: no log $3"
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
