#!/usr/bin/env bash
# No silent loss of work (issue #38): each case provokes one way of losing or wasting a run's
# work and checks the message, the exit status and the files left on disk.
#   export       `export --out` onto a checkpoint, its parent, an iter_N or another checkpoint is
#                refused and nothing changes; --force replaces only an earlier export
#   model        resuming another model is refused, every differing field named; weights_only
#   dirs         an unwritable checkpoint.dir / log.dir fails before the first step
#   lock         a second run on one checkpoint.dir is refused naming the holder; a dead
#                holder's lock does not block the next run
#   final_save   a final checkpoint lost to a full disk (a small tmpfs; root only) exits non-zero
#   no_tracker   iter_* without the tracker: the newest verified iteration resumes; keep
#   sigint       a first Ctrl-C saves and exits 75, a second stops at once; hf: temp dirs removed
#   shard_name   a metadata.json shard name with ../ or / is refused
#   schedule     a different train.iters keeps the checkpoint's learning-rate schedule
#   iteration    checkpoint.iteration=N resumes from an earlier iteration; inspect lists them
# Usage: checkpoint_safety.sh MEGAENGINE CASE
set -euo pipefail
bin=$1
what=$2
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
pid=""
mounted=""
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  [ -n "$mounted" ] && umount "$mounted" 2>/dev/null
  chmod -R u+w "$tmp" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
script=$here/lua/train_parallel.lua
quick="train.iters=2 schedule.warmup_iters=1"
failures=0

fail() { echo "FAILED: $*"; failures=$((failures + 1)); }
# A checkpoint of the test recipe's model in $1 (extra overrides after it).
make_ckpt() {
  local dir=$1
  shift
  timeout 120 "$bin" "$script" $quick checkpoint.dir="$dir" "$@" > "$tmp/make.log" 2>&1 ||
    { cat "$tmp/make.log"; echo "FAILED: could not make the checkpoint $dir"; exit 1; }
}
# Every file under $1 with its checksum (and every directory), sorted.
snapshot() { (cd "$1" && find . -type d | sort && find . -type f ! -name megaengine.lock -exec sha256sum {} + | sort); }
# expect NAME ok|fail REGEX COMMAND...: the exit status, the output and no crash.
expect() {
  local name=$1 mode=$2 regex=$3
  shift 3
  local out rc=0
  out=$(timeout 120 "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" > "$tmp/$name.out"
  if [ "$mode" = ok ] && [ $rc -ne 0 ]; then
    fail "$name: exit $rc, expected 0:"; printf '%s\n' "$out" | tail -8; return
  fi
  if [ "$mode" = fail ] && { [ $rc -eq 0 ] || [ $rc -ge 124 ]; }; then
    fail "$name: exit $rc, expected a clean failure:"; printf '%s\n' "$out" | tail -8; return
  fi
  if ! printf '%s' "$out" | tr '\n' ' ' | grep -Eq -- "$regex"; then
    fail "$name: output does not match /$regex/:"; printf '%s\n' "$out" | tail -8; return
  fi
  if printf '%s' "$out" | grep -Eq 'terminate called|Exception raised from|Segmentation fault'; then
    fail "$name: a crash or C++ exception dump"; return
  fi
  echo "ok $name: $(printf '%s' "$out" | grep -E -- "megaengine: |\[warn|\[error" | head -1 | cut -c1-260)"
}
same_files() {  # name dir before-file
  snapshot "$2" > "$tmp/after"
  cmp -s "$3" "$tmp/after" || { fail "$1: the files under $2 changed:"; diff "$3" "$tmp/after" | head -10; }
}

case_export() {
  local w=$tmp/w
  make_ckpt "$w/runs/a"
  cp -r "$w/runs/a" "$w/runs/b"
  mkdir "$w/notes" && echo "my notes" > "$w/notes/todo.txt"
  echo "a file" > "$w/plain"
  snapshot "$w" > "$tmp/w.before"
  local a=$w/runs/a it=$w/runs/a/iter_0000002
  expect out_is_source fail "--out '$a' is the checkpoint being exported" "$bin" export "$a" --format hf --out "$a" --force
  expect out_is_parent fail "--out '$w/runs' holds the checkpoint being exported" "$bin" export "$a" --format hf --out "$w/runs" --force
  expect out_is_iteration fail "--out '$it' lies inside the checkpoint being exported" "$bin" export "$a" --format hf --out "$it" --force
  expect out_is_source_of_iteration fail "--out '$a' is the checkpoint being exported" "$bin" export "$it" --format hf --out "$a" --force
  expect out_is_other_checkpoint fail "--out '$w/runs/b' is a checkpoint directory" "$bin" export "$a" --format hf --out "$w/runs/b" --force
  expect out_inside_other_checkpoint fail "lies inside '$w/runs/b', which is a checkpoint directory" "$bin" export "$a" --format hf --out "$w/runs/b/hf" --force
  expect out_not_an_export fail "'$w/notes' exists and is not an earlier export" "$bin" export "$a" --format hf --out "$w/notes" --force
  expect out_is_a_file fail "'$w/plain' exists and is not a directory" "$bin" export "$a" --format hf --out "$w/plain" --force
  same_files export_refused "$w" "$tmp/w.before"
  expect export_new ok "exported .* to $w/hf" "$bin" export "$a" --format hf --out "$w/hf"
  expect export_again_needs_force fail "'$w/hf' exists and is not empty: choose a new directory \(or overwrite it: --force\)" \
    "$bin" export "$a" --format hf --out "$w/hf"
  expect export_force_replaces_export ok "exported .* to $w/hf" "$bin" export "$a" --format hf --out "$w/hf" --force
  [ -f "$w/hf/config.json" ] && [ -f "$w/hf/model.safetensors" ] || fail "the forced export left no config.json + model.safetensors"
  [ -f "$a/latest_checkpointed_iteration.txt" ] && [ -d "$it" ] || fail "the checkpoint lost its tracker or iteration"
}

case_model() {
  make_ckpt "$tmp/m"
  snapshot "$tmp/m" > "$tmp/m.before"
  expect other_model_in_dir fail "checkpoint.dir '$tmp/m' holds a checkpoint of another model .*model.vocab: 300 in the recipe, 256 in the checkpoint +model.layers: 1 in the recipe, 2 in the checkpoint +model.heads: 2 in the recipe, 4 in the checkpoint.*checkpoint.weights_only=true" \
    "$bin" "$script" $quick checkpoint.dir="$tmp/m" model.layers=1 model.heads=2 model.vocab=300
  same_files other_model_in_dir "$tmp/m" "$tmp/m.before"
  expect other_model_load fail "checkpoint.load '$tmp/m' is a checkpoint of another model .*model.layers: 1 in the recipe, 2 in the checkpoint.*checkpoint.weights_only=true" \
    "$bin" "$script" $quick checkpoint.dir="$tmp/new" checkpoint.load="$tmp/m" model.layers=1
  ls "$tmp/new" 2>/dev/null | grep -q '^iter_' && fail "other_model_load: $tmp/new holds an iteration"
  expect weights_only ok "checkpoint.weights_only: .* is of another model.*model.layers: 1 in the recipe, 2 in the checkpoint.*started from the weights of $tmp/m/iter_0000002 \(checkpoint.weights_only\): iteration 0" \
    "$bin" "$script" $quick checkpoint.dir="$tmp/new" checkpoint.load="$tmp/m" model.layers=1 checkpoint.weights_only=true
  [ "$(cat "$tmp/new/latest_checkpointed_iteration.txt" 2>/dev/null)" = 2 ] || fail "weights_only: $tmp/new does not hold iteration 2"
  same_files weights_only "$tmp/m" "$tmp/m.before"
  expect same_model_resumes ok "resumed from $tmp/m/iter_0000002" "$bin" "$script" train.iters=3 schedule.warmup_iters=1 checkpoint.dir="$tmp/m"
}

case_dirs() {
  echo "a file" > "$tmp/file"
  local many="train.iters=20 train.log_interval=1"
  expect ckpt_under_file fail "checkpoint.dir = '$tmp/file/ckpt' cannot be used: '$tmp/file' exists and is not a directory" \
    "$bin" "$script" $many checkpoint.dir="$tmp/file/ckpt"
  expect log_under_proc fail "log.dir = '/proc/megaengine-test/log' cannot be used: cannot create directory" \
    "$bin" "$script" $many log.dir=/proc/megaengine-test/log
  mkdir -p "$tmp/ro"
  if [ "$(id -u)" = 0 ]; then
    mount -t tmpfs -o ro,size=1m tmpfs "$tmp/ro" && mounted=$tmp/ro
  else
    chmod 555 "$tmp/ro"
  fi
  expect ckpt_read_only fail "checkpoint.dir = '$tmp/ro' is not writable: cannot create a file in it \((Read-only file system|Permission denied)\)" \
    "$bin" "$script" $many checkpoint.dir="$tmp/ro"
  expect log_read_only_below fail "log.dir = '$tmp/ro/log' cannot be used: cannot create directory '$tmp/ro/log'" \
    "$bin" "$script" $many log.dir="$tmp/ro/log"
  for n in ckpt_under_file log_under_proc ckpt_read_only log_read_only_below; do
    grep -q " iteration " "$tmp/$n.out" && fail "$n: steps were computed before the failure"
  done
  [ "$(cat "$tmp/file")" = "a file" ] || fail "the regular file changed"
  [ -z "$(ls -A "$tmp/ro")" ] || fail "something was written into the read-only directory"
}

case_lock() {
  local dir=$tmp/l
  "$bin" "$script" train.iters=100000 schedule.decay_iters=100000 checkpoint.dir="$dir" > "$tmp/a.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -qs "iteration        3/" "$tmp/a.log" && break; sleep 0.05; done
  grep -qs "iteration        3/" "$tmp/a.log" || { cat "$tmp/a.log"; fail "the first run did not start"; return; }
  snapshot "$dir" > "$tmp/l.before"
  expect second_run_refused fail "checkpoint.dir '$dir' is in use by another run \(host [^,]+, pid $pid, Slurm job [^,]+, since .*; lock file $dir/megaengine.lock\)" \
    "$bin" "$script" $quick checkpoint.dir="$dir"
  same_files second_run_refused "$dir" "$tmp/l.before"
  grep -q "pid $pid," "$dir/megaengine.lock" || fail "the lock file does not name the first run"
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
  expect dead_holder_does_not_block ok "saved checkpoint iteration 2" "$bin" "$script" $quick checkpoint.dir="$dir"
  [ "$(cat "$dir/latest_checkpointed_iteration.txt" 2>/dev/null)" = 2 ] || fail "the run after the dead holder saved nothing"
}

case_final_save() {
  [ "$(id -u)" = 0 ] || { echo "skipped: mounting a small tmpfs needs root"; exit 77; }
  mkdir -p "$tmp/full"
  mount -t tmpfs -o size=256k tmpfs "$tmp/full" || { echo "skipped: cannot mount a tmpfs here"; exit 77; }
  mounted=$tmp/full
  expect final_save_lost fail "the final checkpoint, iteration 2, was NOT saved to $tmp/full/ckpt: .*No space left on device.*This run saved no checkpoint \($tmp/full/ckpt holds iterations none\)" \
    "$bin" "$script" $quick checkpoint.dir="$tmp/full/ckpt"
  ls "$tmp/full/ckpt" | grep -Eq '^iter_|latest_checkpointed' && fail "final_save_lost: an iteration or tracker was left: $(ls "$tmp/full/ckpt")"
  true
}

case_no_tracker() {
  local dir=$tmp/n
  make_ckpt "$dir" train.iters=6 checkpoint.interval=2
  rm "$dir/latest_checkpointed_iteration.txt"
  local shard=$dir/iter_0000006/rank_00000.safetensors
  printf '\x01' | dd of="$shard" bs=1 seek=$(( $(stat -c %s "$shard") - 10 )) conv=notrunc 2>/dev/null
  sha256sum "$shard" | cut -d' ' -f1 > "$tmp/damaged.sum"
  expect resumes_newest_verified ok "has iter_\* directories but no latest_checkpointed_iteration.txt: resuming from iteration 4, the newest complete one.*iterations 6, incomplete or damaged, were moved to $dir/superseded_after_iter_0000004.*resumed from $dir/iter_0000004" \
    "$bin" "$script" train.iters=8 schedule.warmup_iters=1 checkpoint.dir="$dir" checkpoint.interval=2 checkpoint.keep=1
  [ "$(cat "$dir/latest_checkpointed_iteration.txt" 2>/dev/null)" = 8 ] || fail "no_tracker: the tracker does not name 8"
  [ "$(ls "$dir" | grep '^iter_' | tr '\n' ' ')" = "iter_0000008 " ] || fail "no_tracker: keep=1 left $(ls "$dir" | tr '\n' ' ')"
  [ "$(sha256sum "$dir/superseded_after_iter_0000004/iter_0000006/rank_00000.safetensors" 2>/dev/null | cut -d' ' -f1)" = "$(cat "$tmp/damaged.sum")" ] ||
    fail "no_tracker: the damaged iteration 6 was not kept aside as it was"
  mkdir -p "$tmp/foreign/iter_0000100/mp_rank_00"
  expect foreign_iterations_refused fail "checkpoint.dir '$tmp/foreign' holds iter_\* directories but no latest_checkpointed_iteration.txt and no complete megaengine checkpoint" \
    "$bin" "$script" $quick checkpoint.dir="$tmp/foreign"
  [ -d "$tmp/foreign/iter_0000100/mp_rank_00" ] || fail "foreign_iterations_refused: the foreign iteration changed"
}

case_sigint() {
  local dir=$tmp/s common="schedule.decay_iters=100000 train.iters=100000"
  "$bin" "$script" $common checkpoint.dir="$dir" > "$tmp/int.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -qs "iteration        3/" "$tmp/int.log" && break; sleep 0.05; done
  kill -INT "$pid"
  local rc=0
  wait "$pid" || rc=$?
  pid=""
  [ $rc -eq 75 ] || { fail "first SIGINT: exit $rc, expected 75"; tail -5 "$tmp/int.log"; }
  local line it
  line=$(grep -E "stopping: SIGINT \(Ctrl-C\) at iteration [0-9]+; a checkpoint of it was saved" "$tmp/int.log") ||
    { fail "first SIGINT: no save reported"; tail -5 "$tmp/int.log"; return; }
  it=$(printf '%s' "$line" | sed -E 's/.*iteration ([0-9]+);.*/\1/')
  [ "$(cat "$dir/latest_checkpointed_iteration.txt")" = "$it" ] || fail "first SIGINT: the tracker does not name $it"
  [ -f "$dir/iter_$(printf %07d "$it")/rank_00000.safetensors" ] || fail "first SIGINT: iteration $it has no shard"
  echo "ok first_sigint: saved iteration $it, exit 75"
  # A second one while the first one's save is being written (slowed down to 5 s a MiB): the
  # process dies of SIGINT at once, and the tracker stays where it was.
  ME_TEST_CHECKPOINT_SLOW_MS=5000 "$bin" "$script" $common checkpoint.dir="$dir" > "$tmp/int2.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -qs "iteration  *$((it + 2))/" "$tmp/int2.log" && break; sleep 0.05; done
  kill -INT "$pid"
  for _ in $(seq 1 100); do grep -qs "writing in the background" "$tmp/int2.log" && break; sleep 0.05; done
  kill -INT "$pid"
  rc=0
  wait "$pid" || rc=$?
  pid=""
  [ $rc -eq 130 ] || fail "second SIGINT: exit $rc, expected 130 (killed by SIGINT)"
  [ "$(cat "$dir/latest_checkpointed_iteration.txt")" = "$it" ] || fail "second SIGINT: the tracker moved"
  echo "ok second_sigint: exit $rc, tracker still $it"
  # hf: conversions in $TMPDIR are removed once loaded, and orphans of dead processes at the next one.
  ME_EQUIV_MODEL=llama make_ckpt "$tmp/llama"
  "$bin" export "$tmp/llama" --format hf --out "$tmp/hf" > /dev/null
  mkdir -p "$tmp/tmpdir"
  sleep 0 & local dead=$!
  wait "$dead"
  mkdir -p "$tmp/tmpdir/megaengine-hf-$dead-abcdef/iter_0000000"
  TMPDIR=$tmp/tmpdir ME_EQUIV_MODEL=llama "$bin" "$script" $common checkpoint.load="hf:$tmp/hf" > "$tmp/hf.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do grep -qs "iteration        3/" "$tmp/hf.log" && break; sleep 0.05; done
  [ -z "$(ls -A "$tmp/tmpdir")" ] || fail "hf: $TMPDIR holds $(ls "$tmp/tmpdir") while the run goes on"
  kill -INT "$pid"
  rc=0
  wait "$pid" || rc=$?
  pid=""
  grep -q "removed $tmp/tmpdir/megaengine-hf-$dead-abcdef, a conversion left by process $dead" "$tmp/hf.log" ||
    fail "hf: the orphaned conversion was not removed"
  [ -z "$(ls -A "$tmp/tmpdir")" ] || fail "hf: $tmp/tmpdir holds $(ls "$tmp/tmpdir") after SIGINT (exit $rc)"
  echo "ok hf_temp_dirs: none left (exit $rc)"
}

case_shard_name() {
  make_ckpt "$tmp/good"
  for name in ../rank_00000.safetensors /tmp/rank_00000.safetensors; do
    rm -rf "$tmp/c" && cp -r "$tmp/good" "$tmp/c"
    python3 - "$tmp/c/iter_0000002/metadata.json" "$name" <<'EOF'
import json, sys
path, name = sys.argv[1], sys.argv[2]
m = json.load(open(path))
m["shards"][name] = m["shards"].pop("rank_00000.safetensors")
for t in m["tensors"].values():
    for p in t["pieces"]:
        p["file"] = name
json.dump(m, open(path, "w"))
EOF
    # The shard where the name points (beside the checkpoint): followed, it would load.
    [ "$name" = ../rank_00000.safetensors ] && cp "$tmp/c/iter_0000002/rank_00000.safetensors" "$tmp/c/"
    expect "shard_name_${name//[^a-z]/_}" fail "metadata.json': shard '$name' is not a file name in the checkpoint's directory" \
      "$bin" "$script" train.iters=3 schedule.warmup_iters=1 checkpoint.dir="$tmp/c"
    expect "inspect_${name//[^a-z]/_}" fail "shard '$name' is not a file name" "$bin" checkpoint inspect "$tmp/c"
  done
}

lrs() { grep -oE "iteration +[0-9]+/ *[0-9]+ .*learning rate: [0-9.E+-]+" "$1" | sed -E 's/iteration +([0-9]+)\/.*learning rate: ([0-9.E+-]+)/\1 \2/'; }
case_schedule() {
  "$bin" "$script" train.iters=10 > "$tmp/full10.log" 2>&1 || { cat "$tmp/full10.log"; exit 1; }
  "$bin" "$script" train.iters=20 > "$tmp/full20.log" 2>&1 || { cat "$tmp/full20.log"; exit 1; }
  "$bin" "$script" train.iters=10 train.exit_interval=5 checkpoint.dir="$tmp/a" > "$tmp/first.log" 2>&1 ||
    { cat "$tmp/first.log"; exit 1; }
  cp -r "$tmp/a" "$tmp/b"
  expect keeps_checkpoint_schedule ok "the learning-rate schedule differs from the one of the checkpoint's run: +end of the decay \(schedule.decay_iters, else train.iters\): 10 in the checkpoint's run, 20 in this recipe.*keeping the checkpoint's" \
    "$bin" "$script" checkpoint.dir="$tmp/a" train.iters=20
  expect override_schedule ok "following the recipe's \(checkpoint.override_schedule = true\)" \
    "$bin" "$script" checkpoint.dir="$tmp/b" train.iters=20 checkpoint.override_schedule=true
  lrs "$tmp/keeps_checkpoint_schedule.out" | awk '$1 >= 6 && $1 <= 10' > "$tmp/kept"
  lrs "$tmp/full10.log" | awk '$1 >= 6 && $1 <= 10' > "$tmp/want10"
  lrs "$tmp/override_schedule.out" | awk '$1 >= 6 && $1 <= 10' > "$tmp/overridden"
  lrs "$tmp/full20.log" | awk '$1 >= 6 && $1 <= 10' > "$tmp/want20"
  [ -s "$tmp/want10" ] && diff "$tmp/want10" "$tmp/kept" > /dev/null ||
    { fail "the resumed run's rates (iterations 6-10) are not the checkpoint's schedule:"; paste "$tmp/want10" "$tmp/kept"; }
  [ -s "$tmp/want20" ] && diff "$tmp/want20" "$tmp/overridden" > /dev/null ||
    { fail "override_schedule: the rates are not the recipe's schedule:"; paste "$tmp/want20" "$tmp/overridden"; }
  ! cmp -s "$tmp/want10" "$tmp/want20" || fail "schedule: the two schedules do not differ at iterations 6-10 (a test that cannot fail)"
}

case_iteration() {
  local dir=$tmp/i
  make_ckpt "$dir" train.iters=4 checkpoint.interval=2
  local shard=$dir/iter_0000004/rank_00000.safetensors
  printf '\x01' | dd of="$shard" bs=1 seek=$(( $(stat -c %s "$shard") - 10 )) conv=notrunc 2>/dev/null
  sha256sum "$shard" | cut -d' ' -f1 > "$tmp/damaged.sum"
  expect checksum_names_earlier fail "fails its checksum .*load an earlier checkpoint: checkpoint.iteration=2 \($dir holds iterations 2, 4\)" \
    "$bin" "$script" train.iters=6 schedule.warmup_iters=1 checkpoint.dir="$dir"
  expect inspect_lists ok "checkpoint directory $dir: iterations 2, 4 \(the latest: 4\)" "$bin" checkpoint inspect "$dir"
  expect iteration_missing fail "checkpoint.iteration = 3: '$dir' holds no complete iteration 3; its iterations: 2, 4" \
    "$bin" "$script" train.iters=6 schedule.warmup_iters=1 checkpoint.dir="$dir" checkpoint.iteration=3
  expect earlier_iteration ok "resuming from iteration 2 \(checkpoint.iteration\); the newer iterations 4 were moved to $dir/superseded_after_iter_0000002.*resumed from $dir/iter_0000002" \
    "$bin" "$script" train.iters=6 schedule.warmup_iters=1 checkpoint.dir="$dir" checkpoint.iteration=2 checkpoint.interval=2
  [ "$(cat "$dir/latest_checkpointed_iteration.txt")" = 6 ] || fail "earlier_iteration: the tracker does not name 6"
  [ -d "$dir/iter_0000004" ] && [ -d "$dir/iter_0000006" ] || fail "earlier_iteration: iterations 4 and 6 were not saved"
  [ "$(sha256sum "$dir/superseded_after_iter_0000002/iter_0000004/rank_00000.safetensors" | cut -d' ' -f1)" = "$(cat "$tmp/damaged.sum")" ] ||
    fail "earlier_iteration: the damaged iteration 4 was not kept aside as it was"
  expect requeue_goes_on ok "checkpoint.iteration = 2 was applied already .*resumed from $dir/iter_0000006" \
    "$bin" "$script" train.iters=8 schedule.warmup_iters=1 checkpoint.dir="$dir" checkpoint.iteration=2
}

"case_$what"
[ $failures -eq 0 ] || { echo "checkpoint_safety $what: $failures failed"; exit 1; }
echo "checkpoint_safety $what: all passed"
