#!/usr/bin/env bash
# What train.deterministic costs on one GPU: bench/speed/megaengine_row.lua with it off and on,
# alternated ROUNDS times per model in one call so that drifting clocks hit both alike.
#   bash bench/determinism/cost.sh MEGAENGINE OUT_DIR [MODEL ...]   (default gpt1.3b gpt39b-2l)
# Prints each row and, per model, mean tokens/s off and on and their ratio (on / off).
set -uo pipefail
bin=$1 out=$2
shift 2
models=${*:-gpt1.3b gpt39b-2l}
repo=$(cd "$(dirname "$0")/../.." && pwd)
export ME_BENCH_STEPS=${ME_BENCH_STEPS:-15} ME_BENCH_WARMUP=${ME_BENCH_WARMUP:-5}
mkdir -p "$out"
for m in $models; do
  micro=4
  [ "$m" = gpt39b-2l ] && micro=1  # the user's width at micro 1, as its recipe runs
  for r in $(seq 1 "${ME_BENCH_ROUNDS:-2}"); do
    for mode in false true; do
      log=$out/$m.$mode.$r.log
      ME_BENCH_MODEL=$m ME_BENCH_MICRO=$micro ME_BENCH_OVERRIDES="train.deterministic=$mode" \
        ME_BENCH_JSON=$out/$m.$mode.jsonl "$bin" "$repo/bench/speed/megaengine_row.lua" > "$log" 2>&1 ||
        { echo "$m deterministic=$mode failed:"; tail -5 "$log"; }
      echo "$m deterministic=$mode round $r: $(grep -a "iteration .*/" "$log" | tail -1 | grep -o 'tokens/s: [0-9]*')"
    done
  done
  python3 - "$out/$m.false.jsonl" "$out/$m.true.jsonl" "$m" <<'PY'
import json, sys
mean = lambda p: (lambda v: sum(v) / len(v))([json.loads(l)["tokens_per_s"] for l in open(p)])
off, on = mean(sys.argv[1]), mean(sys.argv[2])
print(f"{sys.argv[3]}: deterministic off {off:,.0f} tokens/s, on {on:,.0f} tokens/s, on/off {on / off:.3f}")
PY
done
