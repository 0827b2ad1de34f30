# Sourced by the tests in tests/cluster/ after two_nodes.sh: the small training run they share and
# what they check in a job's log.

# recipes/gpt_tiny.lua made small: a few seconds of CPU per job. dead_after_s well under the
# tests' limits; a log line every 2 iterations.
tiny_args=(train.iters=8 train.log_interval=2 train.eval_iters=0 train.eval_interval=0 sample.tokens=0
           model.layers=2 model.hidden=64 model.heads=4 model.seq=32 batch.micro=4 schedule.warmup_iters=2
           comm.timeout_s=60 comm.dead_after_s=6)

losses() {  # LOG: rank 0's progress-line losses, one a line
  grep -o 'iteration *[0-9]*/ *[0-9]* |.*lm loss: [-0-9.E+]*' "$1" | grep -o 'lm loss: [-0-9.E+]*' | awk '{print $3}'
}

check_loss_falls() {  # LOG
  local l
  l=$(losses "$1")
  [ "$(echo "$l" | wc -w)" -ge 3 ] || fail "fewer than 3 progress lines in $1: $(cat "$1")"
  echo "$l" | awk 'NR==1{first=$1} {last=$1} END{exit !(last < first)}' || fail "the loss did not fall: $(echo $l)"
  echo "losses: $(echo $l)"
}

# The layout table (rank 0's "layout:" block) has exactly these rows; each ROW is
# "RANK HOST TP DP PP" (cp 1, CPU). Any tensor-parallel group across hosts is a failure too.
check_layout() {  # LOG WORLD ROW...
  local log=$1 world=$2 row rank host tp dp pp table
  shift 2
  table=$(grep -A $((world + 1)) "layout: world $world = " "$log" | tail -n "$world")
  [ -n "$table" ] || fail "no layout table for a world of $world in $log: $(cat "$log")"
  for row in "$@"; do
    read -r rank host tp dp pp <<<"$row"
    grep -Eq "^ +$rank +$host +cpu +$tp +0 +$dp +$pp *\$" <<<"$table" ||
      fail "layout row of rank $rank is not host $host, tp $tp, dp $dp, pp $pp:"$'\n'"$table"
  done
  ! grep -q "spans hosts" "$log" || fail "a tensor-parallel group spans hosts: $(grep "spans hosts" "$log")"
  echo "layout:"$'\n'"$table"
}
