#!/usr/bin/env bash
# Every two-node test of issue 40 (tests/cluster/), one after the other, each on a cluster of its
# own; CI runs the first three (tests/CMakeLists.txt, label "cluster"). Prints one line per test
# and exits non-zero when any failed; a skipped test (77) is reported as SKIPPED.
#   bash tests/cluster/run_all.sh build/megaengine
set -uo pipefail
bin=$(readlink -f "${1:-build/megaengine}")
here=$(cd "$(dirname "$0")" && pwd)
failed=0
summary=""
for t in two_nodes train_tp dead_node torchrun pp_layouts resume_one_node doctor; do
  start=$(date +%s)
  timeout 300 bash "$here/$t.sh" "$bin" >"/tmp/me-cluster-$t.log" 2>&1
  rc=$?
  case $rc in
    0) result=PASSED ;;
    77) result="SKIPPED ($(grep -m1 '^SKIP' "/tmp/me-cluster-$t.log"))" ;;
    *) result="FAILED (exit $rc, log /tmp/me-cluster-$t.log)"; failed=1 ;;
  esac
  summary+=$(printf '%-16s %4d s  %s' "$t" $(( $(date +%s) - start )) "$result")$'\n'
  [ "$rc" -eq 0 ] && rm -f "/tmp/me-cluster-$t.log"
  echo "$t: $result"
done
echo "---"
printf '%s' "$summary"
exit $failed
