# A two-node Slurm cluster on this one machine, for the multi-host paths. Sourced by the tests in
# tests/cluster/ (cluster_up, then jobs); run directly, it checks itself (see the end).
#
# Network: a "switch" namespace holds a bridge; every other namespace is joined to it by a veth
# pair and has one address in 192.0.2.0/24 (TEST-NET-1). Nothing is added to the machine's own
# namespace: its interfaces, addresses and routes stay as they are (this machine may itself sit
# on 192.0.2.0/24), and traffic stays between these namespaces.
#   head   192.0.2.10  munged, slurmctld, the client commands (sbatch, scontrol)
#   node1  192.0.2.11  slurmd (NodeName=node1), the job's first node: rank 0, the store
#   node2  192.0.2.12  slurmd (NodeName=node2)
# Each daemon runs under `unshare --uts` with the node's hostname, so the job's ranks see node1
# and node2 as gethostname(). No /etc/hosts entries: the names resolve nowhere, which the engine
# must not need (Slurm uses NodeAddr).
#
# Everything goes on exit, failure or not: processes (by the job token, then every PID left in
# the namespaces), the namespaces (with their veths and the bridge), the temp dir.
#   source tests/cluster/two_nodes.sh; cluster_up; submit NAME ...; wait_job ID
#   bash tests/cluster/two_nodes.sh            # the fixture's own test
repo=${repo:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
source "$repo/tests/cluster/slurm_common.sh"

cluster_net=192.0.2
declare -A cluster_addr=([head]=$cluster_net.10 [node1]=$cluster_net.11 [node2]=$cluster_net.12 [node3]=$cluster_net.13)
cluster_namespaces=()  # created so far, the switch first

ns_of() { echo "me$$-$1"; }  # NODE -> its namespace (unique per test process)

# Runs COMMAND in NODE's namespace with NODE as its hostname, carrying the job token. nsenter,
# not `ip netns exec`: that one mounts a fresh /sys, without the cgroup file system slurmd needs.
in_node() {  # NODE: sets in_node_cmd, the command prefix (each part execs the next)
  in_node_cmd=(env "$token" nsenter --net="/run/netns/$(ns_of "$1")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$1")
}
on() {  # NODE COMMAND...
  in_node "$1"
  "${in_node_cmd[@]}" "${@:2}"
}
slurm_client() { on head "$@"; }
start_daemon() {  # NODE LOG COMMAND...: in the background, its PID (the daemon's) in daemon_pids
  in_node "$1"
  "${in_node_cmd[@]}" "${@:3}" >"$2" 2>&1 &
  daemon_pids+=($!)
  disown $!  # the cleanup's kills are expected: no "Killed" lines from the shell
}

add_namespace() {  # NODE: a namespace on the switch, with the node's address
  local node=$1 ns
  ns=$(ns_of "$node")
  ip netns add "$ns" || return 1
  cluster_namespaces+=("$ns")
  ip -n "$(ns_of switch)" link add "$node" type veth peer name eth0 netns "$ns" &&
    ip -n "$(ns_of switch)" link set "$node" master br0 up &&
    ip -n "$ns" addr add "${cluster_addr[$node]}/24" dev eth0 &&
    ip -n "$ns" link set eth0 up && ip -n "$ns" link set lo up
}

# Every process still in a namespace, by PID, then the namespace itself (its veth goes with it;
# the switch's bridge with the switch).
remove_namespaces() {
  local ns pids i
  for ns in "${cluster_namespaces[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
  done
  for ((i = ${#cluster_namespaces[@]} - 1; i >= 0; i--)); do
    ns=${cluster_namespaces[$i]}
    for _ in $(seq 50); do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.1; done
    ip netns del "$ns" 2>/dev/null
  done
}

node_pids() { ip netns pids "$(ns_of "$1")" 2>/dev/null; }  # NODE: every process in its namespace

kill_node() {  # NODE: every process of the node, at once (a node that lost power)
  local pids
  pids=$(node_pids "$1")
  [ -n "$pids" ] && kill -KILL $pids
  echo "killed $1: $(echo $pids | wc -w) processes"
}

network_up() {  # NODE...: the switch and a namespace for each node; skips where it cannot
  local node
  slurm_require ip unshare nsenter
  slurm_init two-nodes
  after_kill_hooks+=(remove_namespaces)
  ip netns add "$(ns_of switch)" 2>"$tmp/netns.err" ||
    skip "cannot create a network namespace here ($(cat "$tmp/netns.err")): needs root and CONFIG_NET_NS"
  cluster_namespaces+=("$(ns_of switch)")
  ip -n "$(ns_of switch)" link add br0 type bridge && ip -n "$(ns_of switch)" link set br0 up ||
    skip "cannot create a bridge in a network namespace here"
  for node in "$@"; do
    add_namespace "$node" || skip "cannot join namespace $node to the bridge by a veth pair here"
  done
  on node2 bash -c "exec 3<>/dev/tcp/${cluster_addr[node1]}/1" 2>"$tmp/tcp.err" || true
  grep -q "refused" "$tmp/tcp.err" || skip "node2 does not reach node1 over the bridge: $(cat "$tmp/tcp.err")"
  cd "$tmp/job"
}

cluster_up() {  # [CPUS per node, default 4]: the network, munged, slurmctld, two slurmds
  local cpus=${1:-4} node
  network_up head node1 node2

  start_munged nsenter --net="/run/netns/$(ns_of head)"
  {
    slurm_conf_common head "${cluster_addr[head]}" 6817 6818
    echo "SlurmdTimeout=30"
    for node in node1 node2; do
      echo "NodeName=$node NodeAddr=${cluster_addr[$node]} NodeHostname=$node CPUs=$cpus State=UNKNOWN"
    done
    echo "PartitionName=test Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP"
  } >"$tmp/slurm.conf"
  export SLURM_CONF=$tmp/slurm.conf
  start_daemon head "$tmp/log/slurmctld.out.log" slurmctld -D -i -f "$SLURM_CONF"
  for node in node1 node2; do
    mkdir -p "$tmp/spool/$node"
    start_daemon "$node" "$tmp/log/slurmd-$node.out.log" slurmd -D -f "$SLURM_CONF" -N "$node"
  done
  wait_idle node1 node2
  echo "cluster: node1 ${cluster_addr[node1]} and node2 ${cluster_addr[node2]} idle ($cpus CPUs each), controller ${cluster_addr[head]}"
}

# --time=10: more than train.sbatch's --signal=USR1@300, which would otherwise come at once.
submit() {  # NAME SBATCH-ARGS... -> the job id, at once (from the controller's namespace)
  slurm_client sbatch --parsable --job-name="$1" --gpus-per-node=0 --time=10 "${@:2}" | cut -d';' -f1
}

# ---- the fixture's own test ----------------------------------------------------------------------
# A job of one task per node reports each node's hostname and address; then the cluster is torn
# down, after a failure too, and nothing of it is left.
fixture_job() {
  cluster_up 2
  local id log
  id=$(submit hosts --nodes=2 --ntasks-per-node=1 --wrap \
         'srun --label bash -c "echo \$(hostname) \$SLURMD_NODENAME \$(ip -4 -o addr show dev eth0 | grep -o \"inet [0-9.]*\")"')
  wait_job "$id" 60
  log=$tmp/job/slurm-$id.out
  check_completed hosts "$id" "$log"
  grep -qx "0: node1 node1 inet ${cluster_addr[node1]}" "$log" && grep -qx "1: node2 node2 inet ${cluster_addr[node2]}" "$log" ||
    fail "the tasks did not run as node1 and node2 at their addresses: $(cat "$log")"
  echo "fixture: $(tr '\n' ';' <"$log")"
  if [ "${1:-}" = fail ]; then
    echo "fixture: failing on purpose with a job and processes running"
    on node2 sleep 1000 2>/dev/null &  # a stray process in a node's namespace, and a running job
    id=$(submit sleeper --nodes=2 --ntasks-per-node=1 --wrap 'srun sleep 1000')
    for _ in $(seq 50); do [ "$(job_state "$id")" = RUNNING ] && break; sleep 0.2; done
    echo "$tmp" >"$2"
    false
  fi
  echo "$tmp" >"$2"
}

leftovers() {  # PID-PREFIX TMP: what a cluster left behind
  local what=""
  ip netns list 2>/dev/null | grep -q "^me$1-" && what+=" namespaces: $(ip netns list | grep "^me$1-" | tr '\n' ' ')"
  [ -e "$2" ] && what+=" temp dir $2"
  grep -lz "ME_SLURM_TEST_TOKEN=me-two-nodes-$1-" /proc/[0-9]*/environ >/dev/null 2>&1 && what+=" processes"
  echo "$what"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  out=$(mktemp /tmp/me-two-nodes-fixture.XXXXXX)
  trap 'rm -f "$out"' EXIT
  for mode in ok fail; do
    set +e
    bash -c 'set -euo pipefail; source "$1"; fixture_job "$2" "$3"' fixture "${BASH_SOURCE[0]}" "$mode" "$out" &
    child=$!
    wait $child
    rc=$?
    set -e
    [ "$rc" -eq 77 ] && exit 77
    [ "$mode" = ok ] && [ "$rc" -ne 0 ] && { echo "FAILED: the cluster's job failed (exit $rc)"; exit 1; }
    [ "$mode" = fail ] && [ "$rc" -eq 0 ] && { echo "FAILED: the failing run exited 0"; exit 1; }
    left=$(leftovers "$child" "$(cat "$out")")
    [ -z "$left" ] || { echo "FAILED: after the $mode run, left behind:$left"; exit 1; }
    echo "fixture: the $mode run (exit $rc) left nothing behind"
  done
  echo "two_nodes: all checks passed"
fi
