#!/usr/bin/env bash
# The planner's host term (engine/plan/device_profile.h: host_layer_ms, host_layer_ms_no_sp,
# host_micro_ms), measured here and written into a copy of a profile: for tp 1, 2, 4 (up to this
# machine's GPUs, or ME_PROBE_MAX_TP) and, at tp > 1, with and without sequence parallelism, the
# marginal step time of a layer of bench/planner/host_probe.lua's GPT (so narrow that the host's
# issue time is all a step takes): (ms at 6 layers - ms at 2 layers) / 4; and (with SP at tp > 1)
# the marginal micro-batch less its 2 layers: (ms at 2 micro-batches - ms at 1) - 2 x the layer's,
# the embedding, output layer and loss. `plan --calibrate` cannot measure it in its own process
# (a training run per point), so it is this separate step.
#   source .debs/device-env.sh && bash bench/planner/calibrate_host.sh BUILD_DIR IN.json OUT.json
# IN.json: a profile (megaengine plan --calibrate's, or profiles/h100-80gb.json); OUT.json: the same
# with the host term and its source added. Environment: ME_PROBE_MAX_TP, ME_PROBE_STEPS (20),
# ME_PROBE_REPEATS (1: runs per point, the median taken; the points are differences of short runs,
# which move by tens of percent between runs at 12 steps: bench/RESULTS.md, twenty-second session).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$1 in=$2 out=$3
[ -x "$build/megaengine" ] || { echo "calibrate_host: no megaengine in $build (build it first)"; exit 2; }
[ -f "$in" ] || { echo "calibrate_host: no profile '$in' (megaengine plan --calibrate makes one)"; exit 2; }
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
max=${ME_PROBE_MAX_TP:-$([ "$gpus" -gt 0 ] && echo "$gpus" || echo 2)}
points=$(mktemp)
trap 'rm -f "$points"' EXIT
probe() {  # tp sp layers micro-batches -> the JSON line: the median run's of ME_PROBE_REPEATS
  local launch=() lines="" i
  [ "$1" -gt 1 ] && launch=(--nproc "$1")
  for ((i = 0; i < ${ME_PROBE_REPEATS:-1}; ++i)); do
    lines+=$(ME_PROBE_SP=$2 ME_PROBE_LAYERS=$3 ME_PROBE_MICRO_BATCHES=$4 timeout 300 "$build/megaengine" "${launch[@]}" \
      "$repo/bench/planner/host_probe.lua" 2>&1 | grep -o '{"tp".*}' | tail -1)$'\n'
  done
  grep . <<< "$lines" | sort -t: -k6 -g | awk '{ line[NR] = $0 } END { if (NR) print line[int((NR + 1) / 2)] }'
}
for tp in 1 2 4 8; do
  [ "$tp" -le "$max" ] || continue
  for sp in true false; do
    [ "$tp" -eq 1 ] && [ "$sp" = false ] && continue
    for point in "2 1" "6 1" "2 2"; do
      read -r layers micro <<< "$point"
      [ "$micro" -eq 2 ] && [ "$sp" = false ] && [ "$tp" -gt 1 ] && continue
      line=$(probe "$tp" "$sp" "$layers" "$micro")
      [ -n "$line" ] || { echo "calibrate_host: the probe at tp $tp (sp $sp, $layers layers, $micro micro-batches) failed; rerun it by hand:"
                          echo "  ME_PROBE_SP=$sp ME_PROBE_LAYERS=$layers ME_PROBE_MICRO_BATCHES=$micro $build/megaengine --nproc $tp bench/planner/host_probe.lua"; exit 1; }
      echo "$line" | tee -a "$points"
    done
  done
done
python3 - "$in" "$out" "$points" <<'PY'
import datetime, json, os, sys
src, dst, points = sys.argv[1:]
rows = [json.loads(l) for l in open(points)]
profile = json.load(open(src))
terms = {"host_layer_ms": {}, "host_layer_ms_no_sp": {}, "host_micro_ms": {}}
for tp in sorted({r["tp"] for r in rows}):
    for sp in ((True, False) if tp > 1 else (False,)):
        at = {(r["layers"], r.get("micro_batches", 1)): r["ms_per_step"]
              for r in rows if r["tp"] == tp and r["sequence_parallel"] == sp}
        if (2, 1) in at and (6, 1) in at:
            ms = max((at[6, 1] - at[2, 1]) / 4, 1e-3)
            key = "host_layer_ms" if sp or tp == 1 else "host_layer_ms_no_sp"
            terms[key][str(tp)] = round(ms, 4)
            print(f"host per layer and micro-batch at tp {tp}{' + SP' if sp and tp > 1 else ''}: {ms:.3f} ms")
            if (2, 2) in at:
                micro = at[2, 2] - at[2, 1] - 2 * ms
                if micro > 0:
                    terms["host_micro_ms"][str(tp)] = round(micro, 4)
                    print(f"host per micro-batch outside the layers at tp {tp}: {micro:.3f} ms")
                else:  # a difference of noisy differences: leave the profile's curve to the other sizes
                    print(f"host per micro-batch outside the layers at tp {tp}: not written (measured {micro:.3f} ms: "
                          "the second micro-batch cost less than its two layers; rerun with more ME_PROBE_STEPS)")
for key, values in terms.items():
    if values:
        profile[key] = values
    elif key == "host_micro_ms" and profile.pop(key, None) is not None:  # not kept beside a new host_layer_ms
        print("calibrate_host: host_micro_ms dropped from the profile (no size measured)")
profile["source"] += f"; host_layer_ms and host_micro_ms from bench/planner/calibrate_host.sh, {datetime.date.today()}"
with open(dst + ".tmp", "w") as f:
    json.dump(profile, f, indent=2)
    f.write("\n")
os.replace(dst + ".tmp", dst)
print(f"calibrate_host: wrote {dst}")
PY
