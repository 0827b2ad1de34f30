#!/usr/bin/env bash
# The planner against measurement on one host of 4 GPUs (issue #37, acceptance 1): for each
# configuration below, the dry run's estimate (step time, rank 0's allocator peak) beside the
# measured one (bench/speed/megaengine_row.lua: the mean of the timed windows, rank 0's peak),
# and for each model whether the planner's first choice among its rows is the measured fastest.
#   source .debs/device-env.sh && bash bench/planner/validate.sh OUT_DIR [PROFILE.json]
# PROFILE.json: a calibrated profile (megaengine --nproc 4 plan --calibrate F); default h100-80gb.
# Environment: ME_BENCH_BUILD (/tmp/b), ME_BENCH_STEPS (6), ME_BENCH_WARMUP (3),
# ME_BENCH_DEADLINE_S (540), ME_PLANNER_ROWS (the configurations' numbers to run, e.g. "3 5 8";
# default all). OUT_DIR ends with table.md, rows.jsonl and logs.tgz.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$1
profile=${2:-}
build=${ME_BENCH_BUILD:-/tmp/b}
deadline=${ME_BENCH_DEADLINE_S:-540}
warmup=${ME_BENCH_WARMUP:-3}
steps=${ME_BENCH_STEPS:-6}
mkdir -p "$out/logs"
t0=$SECONDS
where=(--gpu h100-80gb)
[ -n "$profile" ] && where=(--profile "$profile")

# model (megaengine_row.lua's name) | recorded.lua's name | micro | overrides (layout, batch, depth)
configs=(
  "gpt1.3b|gpt1.3b|4|batch.global=16"
  "gpt1.3b|gpt1.3b|4|batch.global=16 parallel.tp=2 parallel.sequence_parallel=true"
  "gpt1.3b|gpt1.3b|4|batch.global=16 parallel.tp=4 parallel.sequence_parallel=true"
  "gpt1.3b|gpt1.3b|2|batch.global=16 parallel.pp=4"
  "gpt1.3b|gpt1.3b|2|batch.global=16 parallel.tp=2 parallel.pp=2 parallel.sequence_parallel=true"
  "gpt1.3b|gpt1.3b|4|batch.global=16 model.recompute=full"
  "llama1b|llama1b|2|batch.global=16 model.recompute=selective"
  "gpt39b-2l|gpt39b-width|1|batch.global=8 model.layers=4 parallel.tp=4 parallel.sequence_parallel=true"
  "gpt39b-2l|gpt39b-width|1|batch.global=8 model.layers=4 parallel.tp=4 parallel.sequence_parallel=false"
  "gpt39b-2l|gpt39b-width|1|batch.global=8 model.layers=4 parallel.tp=2 parallel.pp=2 parallel.sequence_parallel=true model.recompute=selective"
  "llama70b-2l|llama70b-width|1|batch.global=8 model.layers=2 parallel.tp=4 parallel.sequence_parallel=true model.recompute=full"
  "llama70b-2l|llama70b-width|1|batch.global=8 model.layers=4 parallel.tp=2 parallel.pp=2 parallel.sequence_parallel=true model.recompute=full"
)

rows=$out/rows.jsonl
: > "$rows"
{
  echo "| model | configuration (4 GPUs) | predicted ms | measured ms | error | predicted MiB | measured MiB | error |"
  echo "|---|---|--:|--:|--:|--:|--:|--:|"
} > "$out/table.md"
: > "$out/ranking.txt"
i=0
for c in "${configs[@]}"; do
  IFS='|' read -r model planned micro overrides <<< "$c"
  i=$((i + 1))
  [ -z "${ME_PLANNER_ROWS:-}" ] || [[ " $ME_PLANNER_ROWS " == *" $i "* ]] || continue
  log=$out/logs/$i-$model.log
  dry=$(ME_PLAN_MODEL=$planned "$build/megaengine" --dry-run "$repo/bench/planner/recorded.lua" --world 4 "${where[@]}" \
          batch.micro="$micro" $overrides 2>&1)
  pred_s=$(sed -n 's/^estimated step time on [^:]*: \([0-9.]*\) s.*/\1/p' <<< "$dry")
  pred_mib=$(sed -n 's/^predicted peak GPU memory on rank 0: \([0-9]*\) MiB.*/\1/p' <<< "$dry")
  if [ $((SECONDS - t0)) -gt "$deadline" ]; then echo "$i skipped (deadline)"; continue; fi
  ME_BENCH_MODEL=$model ME_BENCH_MICRO=$micro ME_BENCH_STEPS=$steps ME_BENCH_WARMUP=$warmup \
    ME_BENCH_JSON=$rows ME_BENCH_LABEL="cfg$i" ME_BENCH_OVERRIDES="$overrides" \
    timeout 240 "$build/megaengine" --nproc 4 "$repo/bench/speed/megaengine_row.lua" > "$log" 2>&1
  echo "$dry" > "$out/logs/$i-$model.dry.txt"
  ms=$(grep -o '"ms_per_step": [0-9.]*' "$log" | tail -1 | grep -o '[0-9.]*$')
  mib=$(grep -o '"peak_mem_mib": [0-9.]*' "$log" | tail -1 | grep -o '[0-9.]*$')
  awk -v m="$model" -v o="$overrides micro $micro" -v ps="${pred_s:-nan}" -v ms="${ms:-nan}" -v pm="${pred_mib:-nan}" -v mm="${mib:-nan}" 'BEGIN {
    printf "| %s | %s | %.1f | %.1f | %+.1f%% | %.0f | %.0f | %+.1f%% |\n", m, o, ps * 1000, ms, 100 * (ps * 1000 / ms - 1), pm, mm, 100 * (pm / mm - 1) }' >> "$out/table.md"
  echo "$model ${pred_s:-nan} ${ms:-nan} $i" >> "$out/ranking.txt"
  echo "$i $model done at $((SECONDS - t0)) s: predicted ${pred_s:-?} s, measured ${ms:-?} ms"
done
# The planner's choice per model (rows of one model share its global batch, so time ranks them)
awk '{ if (!($1 in best_p) || $2 < best_p[$1]) { best_p[$1] = $2; pick[$1] = $3 }
       if (!($1 in best_m) || $3 < best_m[$1]) best_m[$1] = $3 }
     END { for (m in pick) printf "%s: the planner'"'"'s first choice measures %.1f ms, the fastest %.1f ms (%+.1f%%)\n",
                                   m, pick[m], best_m[m], 100 * (pick[m] / best_m[m] - 1) }' "$out/ranking.txt" >> "$out/table.md"
cat "$out/table.md"
echo "whole call: $((SECONDS - t0)) s"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
