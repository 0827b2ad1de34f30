#!/usr/bin/env bash
# The fitted terms of the shipped H100 profile (profiles/h100-80gb.json:
# compute_in_step, tp_exposed, tp_exposed_no_sp) are what bench/planner/fit_step_terms.py gives
# from the measurements committed in bench/planner (dry runs only: no GPU needed); and a table without
# tp 1 rows is refused.
#   bash tests/cli/fit_step_terms.sh build/megaengine
set -uo pipefail
bin=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dir=$repo/bench/planner
python3 "$dir/fit_step_terms.py" "$bin" "$dir/h100x4-tp-width.md" "$repo/profiles/h100-80gb.json" \
  --one-gpu "$dir/h100x4-multi-gpu.jsonl" --write "$tmp/fit.json" > "$tmp/log" 2>&1 ||
  { echo "FAILED: fit_step_terms.py exited $?"; cat "$tmp/log"; exit 1; }
python3 - "$repo/profiles/h100-80gb.json" "$tmp/fit.json" <<'PY' || { cat "$tmp/log"; exit 1; }
import json, sys
shipped, fitted = (json.load(open(p)) for p in sys.argv[1:])
for key in ("compute_in_step", "tp_exposed", "tp_exposed_no_sp"):
    if shipped.get(key) != fitted.get(key):
        sys.exit(f"FAILED: {key}: shipped {shipped.get(key)}, fitted again {fitted.get(key)}")
print("fitted again:", {k: fitted[k] for k in ("compute_in_step", "tp_exposed", "tp_exposed_no_sp")})
PY
grep -v "| tp 1 |" "$dir/h100x4-tp-width.md" > "$tmp/no_tp1.md"
out=$(python3 "$dir/fit_step_terms.py" "$bin" "$tmp/no_tp1.md" "$repo/profiles/h100-80gb.json" 2>&1)
[ $? -ne 0 ] && grep -q "has no tp 1 rows" <<< "$out" || { echo "FAILED: a table without tp 1 rows: $out"; exit 1; }
echo "fit_step_terms: passed"
