#!/usr/bin/env bash
# Bad command-line usage exits 2, as docs/cluster.md says (1 is an error of the run), with a
# message naming the option (issue 38, item 19). --gpu-memory without a unit is refused.
set -u
bin=$1
here=$(cd "$(dirname "$0")/.." && pwd)
tiny=$here/../recipes/gpt_tiny_bytes.lua
failed=0
expect() {  # status regex args...
  local want=$1 regex=$2
  shift 2
  out=$(timeout 60 "$bin" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want" ] || ! printf '%s' "$out" | grep -Eq -- "$regex"; then
    printf 'FAILED: megaengine %s: exit %d (want %d), output:\n%s\n' "$*" "$rc" "$want" "$out"
    failed=1
  fi
}
expect 2 "unknown option '--frobnicate'" --frobnicate
expect 2 "--nproc needs a positive number of processes, got 'x'" --nproc x "$tiny"
expect 2 "--world needs a positive number of GPUs" --dry-run "$tiny" --world 0
expect 2 "-e needs a chunk of Lua code" -e
expect 2 "--gpu-memory: '80' has no unit; write 80GB" --dry-run "$tiny" --gpu-memory 80
expect 2 "--world and --gpu-memory describe the cluster for --dry-run" "$tiny" --world 16
expect 0 "fits" --dry-run "$tiny" --gpu-memory 80GB
expect 1 "unknown device 'tpu'" --dry-run "$tiny" device=tpu  # an error of the recipe, not of usage
[ "$failed" = 0 ] && echo "usage errors exit 2"
exit "$failed"
