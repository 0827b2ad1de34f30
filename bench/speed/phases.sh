#!/usr/bin/env bash
# Where a step's time goes, per model: megaengine with train.profile_phases=true (each phase
# ends with a device synchronisation, so the phases add up to slightly more than a normal step).
#   bash bench/speed/phases.sh BUILD_DIR OUT_DIR [MODEL ...]        (default: llama1b gpt1.3b)
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$1 out=$2
shift 2
mkdir -p "$out"
for m in ${*:-llama1b gpt1.3b}; do
  ME_BENCH_MODEL=$m ME_BENCH_STEPS=${ME_BENCH_STEPS:-10} ME_BENCH_WARMUP=${ME_BENCH_WARMUP:-5} \
    ME_BENCH_OVERRIDES="train.profile_phases=true" \
    "$build/megaengine" "$repo/bench/speed/megaengine_row.lua" > "$out/$m.phases.log" 2>&1 ||
    { echo "$m failed:"; tail -4 "$out/$m.phases.log"; }
  echo "$m:$(grep -a "phases (ms" "$out/$m.phases.log" | tail -1 | sed 's/.*synchronised)://')"
done
