#!/usr/bin/env bash
# train.deterministic on GPUs: for each layout, two fresh runs of bench/determinism/gpt1b.lua
# (100 steps) must log the same loss and gradient norm at every step to the bit, and a third run,
# killed with SIGKILL once its checkpoint of step 50 is committed and started again, must log
# the same values from step 51 on.
#   bash bench/determinism/check.sh MEGAENGINE OUT_DIR [NPROC] [LAYOUT ...]
#   LAYOUT: overrides joined by commas, e.g. parallel.tp=2 or parallel.pp=2,parallel.distributed_optimizer=true
# Prints one line per layout and "determinism: N passed, M failed"; exits 1 if any failed.
set -uo pipefail
bin=$1 out=$2 nproc=${3:-4}
shift 3 2>/dev/null || shift $#
layouts=("$@")
[ ${#layouts[@]} -gt 0 ] || layouts=("parallel.tp=2" "parallel.pp=2,parallel.distributed_optimizer=true")
repo=$(cd "$(dirname "$0")/../.." && pwd)
recipe=$repo/bench/determinism/gpt1b.lua
mkdir -p "$out"
passed=0 failed=0

run() {  # run NAME OVERRIDES...: a fresh run, its exact values in $out/NAME.hex
  local name=$1
  shift
  ME_DET_LOG=$out/$name.hex "$bin" --nproc "$nproc" "$recipe" "$@" > "$out/$name.log" 2>&1
}

killed_and_resumed() {  # NAME OVERRIDES...: saves at 50, killed after 60 is logged, restarted
  local name=$1 ckpt=$out/$1.ckpt
  shift
  rm -rf "$ckpt"
  ME_DET_LOG=$out/$name.hex setsid "$bin" --nproc "$nproc" "$recipe" "$@" checkpoint.dir="$ckpt" \
    checkpoint.interval=50 > "$out/$name.1.log" 2>&1 &
  local pid=$!
  # Killed as soon as the save of step 50 is committed (the tracker names it), a few steps later.
  for _ in $(seq 1 600); do
    [ "$(cat "$ckpt/latest_checkpointed_iteration.txt" 2>/dev/null)" = 50 ] && break
    sleep 0.5
  done
  kill -9 -- -"$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  grep -q "^" "$ckpt/latest_checkpointed_iteration.txt" || { echo "no checkpoint saved before the kill"; return 1; }
  ME_DET_LOG=$out/$name.resumed.hex "$bin" --nproc "$nproc" "$recipe" "$@" checkpoint.dir="$ckpt" \
    > "$out/$name.2.log" 2>&1
}

for layout in "${layouts[@]}"; do
  tag=${layout//[^a-z0-9]/_}
  IFS=',' read -ra overrides <<< "$layout"
  rm -f "$out/$tag".*.hex "$out/$tag".a.hex "$out/$tag".b.hex "$out/$tag".c.hex
  run "$tag.a" "${overrides[@]}" && run "$tag.b" "${overrides[@]}" && killed_and_resumed "$tag.c" "${overrides[@]}"
  status=$?
  a=$out/$tag.a.hex b=$out/$tag.b.hex
  steps=$(wc -l < "$a" 2>/dev/null || echo 0)
  resumed_from=$(head -1 "$out/$tag.c.resumed.hex" 2>/dev/null | cut -d' ' -f1)
  if [ $status -eq 0 ] && [ "$steps" -eq 100 ] && cmp -s "$a" "$b" && [ -n "$resumed_from" ] &&
     cmp -s <(awk -v f="$resumed_from" '$1 >= f' "$a") "$out/$tag.c.resumed.hex"; then
    echo "$layout: PASS: two runs identical at all $steps steps (loss and grad norm, bit for bit); killed at" \
         "$(wc -l < "$out/$tag.c.hex") steps, resumed at step $resumed_from, identical from there to 100" \
         "(last loss $(tail -1 "$a" | awk '{print $2}'))"
    passed=$((passed + 1))
  else
    echo "$layout: FAIL (status $status, $steps steps; first difference of the fresh runs:" \
         "$(diff "$a" "$b" 2>/dev/null | head -3 | tr '\n' ' '); resumed from '${resumed_from}')"
    tail -5 "$out/$tag".*.log 2>/dev/null | tail -20
    failed=$((failed + 1))
  fi
done
echo "determinism: $passed passed, $failed failed"
[ $failed -eq 0 ]
