#!/usr/bin/env bash
# A change to the training step, measured against the commit before it in one device call:
# builds BASE_SRC (a source tree, e.g. `git archive <commit> | tar -x -C .baseline`) and this
# tree side by side, then runs bench/speed/megaengine_row.lua of each, alternating
# base / current ROUNDS times per model so that drifting clocks hit both alike.
#   bash bench/speed/before_after.sh BASE_SRC OUT_DIR [MODEL ...]   (after source .debs/device-env.sh)
# Prints each row's tokens/s and the current/base ratio of the mean per model.
# ME_BENCH_BASE_BUILD / ME_BENCH_CUR_BUILD: build directories already built from the two trees
# (e.g. by an earlier script of the same device call) to use as they are.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
base=$(cd "$1" && pwd) out=$2
shift 2
models=${*:-gpt1.3b llama1b}
rounds=${ME_BENCH_ROUNDS:-2}
export ME_BENCH_STEPS=${ME_BENCH_STEPS:-20} ME_BENCH_WARMUP=${ME_BENCH_WARMUP:-5} NCCL_NVLS_ENABLE=0
export ME_ASSET_DIR=${ME_ASSET_DIR:-$repo/assets}
mkdir -p "$out"
build() {  # build SRC DIR JOBS
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$out/$(basename "$2").cmake.log" 2>&1 &&
    cmake --build "$2" --target megaengine -j "$3" > "$out/$(basename "$2").build.log" 2>&1
}
t0=$SECONDS
b_base=${ME_BENCH_BASE_BUILD:-/tmp/b_base} b_cur=${ME_BENCH_CUR_BUILD:-/tmp/b_cur}
if [ -n "${ME_BENCH_BASE_BUILD:-}" ]; then true & else build "$base" "$b_base" 8 & fi
pb=$!
if [ -n "${ME_BENCH_CUR_BUILD:-}" ]; then true & else build "$repo" "$b_cur" 8 & fi
pc=$!
wait $pb || { echo "base build failed"; tail -20 "$out/b_base.build.log"; exit 1; }
wait $pc || { echo "current build failed"; grep -A5 error "$out/b_cur.build.log" | head -30; exit 1; }
echo "both built in $((SECONDS - t0)) s"
python3 "$repo/bench/reference/matmul_peak.py" --json "$out/peak.jsonl" | tail -1
peak=$(python3 "$repo/bench/speed/table.py" --peak "$out/peak.jsonl")
for m in $models; do
  for r in $(seq 1 "$rounds"); do
    for side in base cur; do
      src=$repo; [ $side = base ] && src=$base
      log=$out/$m.$side.$r.log
      ME_BENCH_MODEL=$m ME_BENCH_PEAK=$peak ME_BENCH_JSON=$out/$side.jsonl \
        "$(eval echo "\$b_$side")/megaengine" "$src/bench/speed/megaengine_row.lua" > "$log" 2>&1 || { echo "$m $side failed:"; tail -5 "$log"; }
      echo "$m $side round $r: $(grep -a "iteration .*/" "$log" | tail -1 | grep -o 'tokens/s: [0-9]*')"
    done
  done
done
python3 - "$out/base.jsonl" "$out/cur.jsonl" <<'PY'
import json, sys
def rows(p):
    out = {}
    for l in open(p):
        r = json.loads(l)
        out.setdefault(r.get("model"), []).append(r)
    return out
b, c = rows(sys.argv[1]), rows(sys.argv[2])
for m in c:
    tb = [r["tokens_per_s"] for r in b.get(m, [])]
    tc = [r["tokens_per_s"] for r in c[m]]
    if not tb: continue
    mb, mc = sum(tb) / len(tb), sum(tc) / len(tc)
    mfu = sum(r.get("mfu", 0) for r in c[m]) / len(tc)
    print(f"{m}: base {mb:,.0f} tokens/s, current {mc:,.0f} tokens/s, current/base {mc / mb:.3f}, current MFU {mfu:.3f}")
PY
