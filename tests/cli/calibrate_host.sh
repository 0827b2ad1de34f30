#!/usr/bin/env bash
# bench/planner/calibrate_host.sh on the CPU (tp 1 and 2 over Gloo, a few steps): the profile it
# writes carries the host term (host_layer_ms at tp 1 and 2, host_layer_ms_no_sp at tp 2;
# host_micro_ms where positive), the planner reads it back (a dry run at tp 2 names a "host-bound"
# term), and a missing input profile is refused by name.
#   bash tests/cli/calibrate_host.sh build/megaengine
set -uo pipefail
bin=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build=$(dirname "$bin")
ME_PROBE_MAX_TP=2 ME_PROBE_STEPS=4 ME_PROBE_WARMUP=2 timeout 240 bash "$repo/bench/planner/calibrate_host.sh" "$build" \
  "$repo/profiles/h100-80gb.json" "$tmp/host.json" > "$tmp/log" 2>&1 ||
  { echo "FAILED: calibrate_host.sh exited $?"; cat "$tmp/log"; exit 1; }
python3 - "$tmp/host.json" <<'PY' || { cat "$tmp/log"; exit 1; }
import json, sys
p = json.load(open(sys.argv[1]))
ok = sorted(p.get("host_layer_ms", {})) == ["1", "2"] and list(p.get("host_layer_ms_no_sp", {})) == ["2"]
ok = ok and all(v > 0 for k in ("host_layer_ms", "host_layer_ms_no_sp") for v in p[k].values())
ok = ok and all(v > 0 for v in p.get("host_micro_ms", {}).values())
ok = ok and "calibrate_host.sh" in p["source"]
print("host term:", p.get("host_layer_ms"), p.get("host_layer_ms_no_sp"), p.get("host_micro_ms"))
sys.exit(0 if ok else "FAILED: the written profile lacks the host term")
PY
"$bin" --dry-run "$repo/recipes/gpt_tiny.lua" --world 2 --profile "$tmp/host.json" parallel.tp=2 > "$tmp/dry" 2>&1 ||
  { echo "FAILED: the dry run with the written profile"; cat "$tmp/dry"; exit 1; }
grep -q "host-bound" "$tmp/dry" || { echo "FAILED: no host-bound term in the dry run"; cat "$tmp/dry"; exit 1; }
# the marginal micro-batch (host_micro_ms) at both sizes: written, or refused as noise (a CPU's
# layers cost more than its host overhead, so either may happen here)
for tp in 1 2; do
  grep -q "host per micro-batch outside the layers at tp $tp: " "$tmp/log" ||
    { echo "FAILED: no host_micro_ms point at tp $tp"; cat "$tmp/log"; exit 1; }
done
out=$(bash "$repo/bench/planner/calibrate_host.sh" "$build" "$tmp/none.json" "$tmp/x.json" 2>&1)
[ $? -eq 2 ] && grep -q "no profile '$tmp/none.json'" <<< "$out" || { echo "FAILED: a missing profile: $out"; exit 1; }
echo "calibrate_host: passed"
