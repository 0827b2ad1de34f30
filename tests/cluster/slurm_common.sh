# Sourced by the tests that run slurm/*.sbatch against a real Slurm: tests/cli/slurm_job.sh (one
# node on loopback) and tests/cluster/two_nodes.sh (two nodes in network namespaces). What they
# share: the requirements (else exit 77, CTest's SKIP_RETURN_CODE), a private temp dir, a job
# token that marks every process they start, cleanup on any exit, munged with its own key, the
# common part of slurm.conf, and waiting for jobs.
#
# The sourcing script calls slurm_init, then adds the daemons' PIDs to daemon_pids (sent SIGTERM
# on exit) and may add functions to after_kill_hooks (run on exit once the processes are gone).
export PATH=$PATH:/usr/sbin:/sbin
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAILED: $*"; dump_logs; exit 1; }

slurm_require() {  # COMMAND...: root and each command, else skip
  [ "$(id -u)" -eq 0 ] || skip "needs root: slurmd starts jobs and munged/slurmctld run as SlurmUser=root here"
  local p
  for p in munged slurmctld slurmd sbatch sinfo scontrol od "$@"; do
    command -v "$p" >/dev/null || skip "$p is not installed (scripts/setup.sh installs Debian's slurm-wlm, munge and iproute2)"
  done
}

# The daemons and sbatch get ME_SLURM_TEST_TOKEN, and everything they start (slurmstepd, the
# ranks) inherits it, so the cleanup finds exactly them and nothing else on the machine.
slurm_init() {  # NAME: $tmp, $token, the cleanup trap
  tmp=$(mktemp -d "/tmp/me-$1.XXXXXX")
  chmod 700 "$tmp"
  token="ME_SLURM_TEST_TOKEN=me-$1-$$-$RANDOM$RANDOM"
  daemon_pids=()
  mkdir -p "$tmp"/{munge,state,spool,log,job/logs}
  chmod 700 "$tmp/munge"
  trap slurm_cleanup EXIT
  trap 'exit 1' INT TERM
}

token_pids() { grep -lzx "$token" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3; }

slurm_cleanup() {
  set +e
  local hook pid alive
  [ -n "${SLURM_CONF:-}" ] && slurm_client scancel --quiet --full --user=root 2>/dev/null
  for pid in "${daemon_pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=$(token_pids)
    [ -z "$alive" ] && break
    sleep 0.1
  done
  [ -n "$alive" ] && kill -KILL $alive 2>/dev/null
  for hook in "${after_kill_hooks[@]}"; do "$hook"; done
  rm -rf "$tmp"
}
after_kill_hooks=()

# Where Slurm's client commands run; two_nodes.sh runs them in the controller's namespace.
slurm_client() { env "$token" "$@"; }

dump_logs() {
  local f
  for f in "$tmp"/log/*.log "$tmp"/job/logs/*; do
    [ -f "$f" ] && { echo "--- $f (last 40 lines)"; tail -n 40 "$f"; }
  done
}

start_munged() {  # [PREFIX-COMMAND...]: munged with its own key and socket, nothing under /etc or /run
  dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$tmp/munge/munge.key"
  env "$token" "$@" munged --foreground --force --socket="$tmp/munge/munge.socket" --key-file="$tmp/munge/munge.key" \
    --log-file="$tmp/log/munged.log" --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/munged.seed" \
    >"$tmp/log/munged.out.log" 2>&1 &
  daemon_pids+=($!)
  for _ in $(seq 50); do [ -S "$tmp/munge/munge.socket" ] && return; sleep 0.1; done
  skip "munged did not start here: $(tail -n 3 "$tmp/log/munged.out.log" "$tmp/log/munged.log" 2>/dev/null | tr '\n' ' ')"
}

# slurm.conf's lines that do not depend on the nodes. %n in the slurmd paths: one per node.
slurm_conf_common() {  # CONTROLLER-NAME CONTROLLER-ADDR CTLD-PORT SLURMD-PORT
  cat <<EOF
ClusterName=metest
SlurmctldHost=$1($2)
SlurmctldPort=$3
SlurmdPort=$4
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool/%n
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd-%n.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd-%n.log
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
EOF
}

check_daemons() {  # a daemon that exited at start: skip with its log
  local pid
  for pid in "${daemon_pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || skip "a Slurm daemon exited at start: $(tail -n 5 "$tmp"/log/slurm*.log 2>/dev/null | tr '\n' ' ')"
  done
}

wait_idle() {  # NODE...: every node idle within 30 s, else skip (this machine cannot run Slurm)
  local node state
  for node in "$@"; do
    state=""
    for _ in $(seq 150); do
      state=$(slurm_client sinfo -h -N -n "$node" -o %t 2>/dev/null || true)
      [ "$state" = idle ] && break
      check_daemons
      sleep 0.2
    done
    [ "$state" = idle ] || skip "node $node is not idle after 30 s (state '$state'): $(tail -n 5 "$tmp"/log/slurm*.log | tr '\n' ' ')"
  done
}

job_state() {  # ID: the final state slurmctld recorded (jobcomp), else what scontrol still shows
  local s
  s=$(grep -o "JobId=$1 .*JobState=[A-Z_]*" "$tmp/log/jobcomp.log" 2>/dev/null | tail -n 1 | sed 's/.*JobState=//')
  [ -n "$s" ] || s=$(slurm_client scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
  echo "$s"
}

# wait_job ID [SECONDS [completing]]: polls until the job has ended (with "completing": or its
# batch script has, while Slurm still cleans up, e.g. on a dead node). Slurm holds a requeued
# job for 2 minutes (Reason=BeginTime); this lifts that hold at once.
wait_job() {
  local info state deadline=$((SECONDS + ${2:-180}))
  while [ $SECONDS -lt $deadline ]; do
    info=$(slurm_client scontrol show job "$1" 2>/dev/null || true)
    state=$(grep -o 'JobState=[A-Z_]*' <<<"$info" | cut -d= -f2)
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) return ;;
      COMPLETING) [ -n "${3:-}" ] && return ;;
      PENDING) grep -q 'Reason=BeginTime' <<<"$info" && slurm_client scontrol update JobId="$1" StartTime=now ;;
    esac
    sleep 0.3
  done
  fail "job $1 still $state after ${2:-180} s"
}

check_completed() {  # NAME JOBID LOG
  local state
  state=$(job_state "$2")
  [ "$state" = COMPLETED ] || fail "$1: job $2 ended $state, not COMPLETED: $(cat "$3" 2>/dev/null)"
  [ -s "$3" ] || fail "$1: no log $3"
}
