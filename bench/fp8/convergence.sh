#!/usr/bin/env bash
# fp8 against bf16 convergence on one GPU (#36, acceptance 2): bench/fp8/convergence.lua for each
# model and precision, the same seed and data, then bench/fp8/compare.py on the four runs.
#   bash bench/fp8/convergence.sh OUT [BUILD_DIR]     (BUILD_DIR default: build)
# Needs no network: assets/ must hold sotu.txt (scripts/fetch_assets.sh --sotu, where there is
# network; carry assets/) and GPT-2's tokenizer files. Each run's metrics go to
# OUT/<model>_<precision>/metrics.jsonl, its output to OUT/<model>_<precision>.log.
# The environment can narrow or adjust it (the defaults are the benchmark):
#   CONV_MODELS="gpt llama"  CONV_PRECISIONS="bf16 fp8"  CONV_OVERRIDES="key=value ..."
# A failed run is reported at once with its log's tail; the others still run (their curves are
# still worth having), and the script exits 1 at the end. It plots OUT/fp8_convergence.png where
# python3 has matplotlib; elsewhere, afterwards: python3 bench/fp8/plot.py OUT PNG
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 OUT [BUILD_DIR]" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
bin=$(cd "${2:-$repo/build}" 2>/dev/null && pwd)/megaengine
[ -x "$bin" ] || { echo "convergence: no megaengine in ${2:-$repo/build}" >&2; exit 2; }
[ -f "$repo/assets/sotu.txt" ] || [ -f "${ME_ASSET_DIR:-/nonexistent}/sotu.txt" ] || {
  echo "convergence: assets/sotu.txt is missing: run scripts/fetch_assets.sh --sotu where there is network" >&2; exit 2; }
models=${CONV_MODELS:-gpt llama}
precisions=${CONV_PRECISIONS:-bf16 fp8}
read -ra overrides <<<"${CONV_OVERRIDES:-}"
failed=()
cd "$repo"
for model in $models; do
  for prec in $precisions; do
    run=${model}_${prec}
    rm -rf "${out:?}/$run"  # metrics.jsonl is appended to: a rerun must not mix with the last one
    start=$(date +%s)
    if CONV_MODEL=$model "$bin" bench/fp8/convergence.lua precision="$prec" log.dir="$out/$run" \
         "${overrides[@]}" >"$out/$run.log" 2>&1; then
      echo "$run: done in $(($(date +%s) - start)) s; $(grep '^ *iteration ' "$out/$run.log" | tail -n 1 |
        sed -E 's/.*(lm loss: [^|]*).*(number of skipped[^|]*).*(number of nan[^|]*).*/\1|\2|\3/')"
    else
      echo "==================== FAILED: $run (exit $?), the end of $out/$run.log: ====================" >&2
      tail -n 20 "$out/$run.log" >&2
      failed+=("$run")
    fi
  done
done
# compare.py's own verdict decides the exit status when every run finished.
python3 "$repo/bench/fp8/compare.py" "$out" --models $models --base "${precisions%% *}" --test "${precisions##* }"
status=$?
if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$repo/bench/fp8/plot.py" "$out" "$out/fp8_convergence.png" --models $models \
    --base "${precisions%% *}" --test "${precisions##* }" || echo "convergence: the plot failed" >&2
else
  echo "convergence: no matplotlib here; plot elsewhere: python3 bench/fp8/plot.py $out PNG"
fi
[ ${#failed[@]} -eq 0 ] || { echo "convergence: FAILED runs: ${failed[*]}" >&2; exit 1; }
exit $status
