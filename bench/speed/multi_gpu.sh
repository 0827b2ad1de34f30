#!/usr/bin/env bash
# Multi-GPU rows of the speed table in one device call: each model on one GPU, data-parallel over
# every GPU of the machine (same micro batch per GPU; plain and with the distributed optimizer),
# and tensor-parallel over 2 (with sequence
# parallelism), and pipeline-parallel over 2 (1F1B with weight gradients after each backward's
# send, the default parallel.pp_deferred_wgrads = 1; 16 micro-batches per step, the stages
# balanced by FLOPs; with 4 GPUs also pp=2 x dp=2, 8 micro-batches each); the plain-PyTorch
# reference (bench/reference/train_ref.py) on one GPU and data-parallel over every GPU (its
# DistributedDataParallel, under torchrun); prints the table and each layout's tokens/s per GPU
# against the same engine's one-GPU row.
#   bash bench/speed/multi_gpu.sh BUILD_DIR OUT_DIR [MODEL ...]    (default: gpt1.3b llama1b)
# Environment: ME_BENCH_STEPS (20), ME_BENCH_WARMUP (5), ME_BENCH_MICRO (4); ME_BENCH_DP_EXTRA
#   (recipe overrides; several rows separated by ';') and ME_BENCH_DP_EXTRA_ENV (VAR=value ...)
#   add data-parallel rows;
#   ME_BENCH_TP_EXTRA (recipe overrides) adds a second tp=2 row; ME_BENCH_SKIP_TP=1 skips the
#   tp=2 row, ME_BENCH_SKIP_PP=1 the pp=2 rows; ME_BENCH_PP_FIRST sets the first stage's layers
#   (0: an even split; unset: parallel.pp_split = "balanced"); ME_BENCH_REF: the reference's modes ("compile",
#   the default; "eager compile"; "" for none); ME_BENCH_REF_NPROC: its GPU counts ("1 N", the
#   default, N being every GPU; "1" for one GPU only); ME_BENCH_SKIP_DISTOPT=1 skips the plain
#   distributed-optimizer row; ME_BENCH_DEADLINE_S: seconds after the start past which the
#   remaining rows are skipped (so a device call's time limit still leaves a table);
#   ME_BENCH_ROWS: more rows, "NPROC:overrides;..." (e.g. "4:parallel.tp=2 parallel.pp=2"), each
#   run where the machine has NPROC GPUs; a row whose log has a step profile (train.profile_at)
#   also prints its exposed communication.
# Each row prints its wall time (process start-up, model initialisation and warm-up included).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$1 out=$2
shift 2
models=${*:-gpt1.3b llama1b}
ngpu=$(nvidia-smi -L | wc -l)
rows=$out/rows.jsonl
text=${ME_ASSET_DIR:-$repo/assets}/moby-dick.txt  # the reference trains on megaengine's rows' bytes (run.sh says why)
mkdir -p "$out"
started=$SECONDS
late() {  # true (and says so) once ME_BENCH_DEADLINE_S seconds have passed
  [ -n "${ME_BENCH_DEADLINE_S:-}" ] && [ $((SECONDS - started)) -ge "$ME_BENCH_DEADLINE_S" ] &&
    { echo "skipped ($*): past ME_BENCH_DEADLINE_S=$ME_BENCH_DEADLINE_S"; return 0; }
  return 1
}
export NCCL_NVLS_ENABLE=0 ME_BENCH_STEPS=${ME_BENCH_STEPS:-20} ME_BENCH_WARMUP=${ME_BENCH_WARMUP:-5}
python3 "$repo/bench/reference/matmul_peak.py" --json "$rows" | tail -1
peak=$(python3 "$repo/bench/speed/table.py" --peak "$rows")
row() {  # model nproc overrides
  local m=$1 n=$2 o=$3 log=$out/$1.$2.${3//[^a-z0-9]/_}${ME_BENCH_LABEL:+x}.log t0=$SECONDS
  late "$m on $n GPUs $o" && return 0
  if [ "$n" -eq 1 ]; then
    CUDA_VISIBLE_DEVICES=0 ME_BENCH_MODEL=$m ME_BENCH_PEAK=$peak ME_BENCH_JSON=$rows ME_BENCH_OVERRIDES="$o" \
      timeout 400 "$build/megaengine" "$repo/bench/speed/megaengine_row.lua" > "$log" 2>&1
  else
    ME_BENCH_MODEL=$m ME_BENCH_PEAK=$peak ME_BENCH_JSON=$rows ME_BENCH_OVERRIDES="$o" \
      timeout 400 "$build/megaengine" --nproc "$n" "$repo/bench/speed/megaengine_row.lua" > "$log" 2>&1
  fi || { echo "$m on $n GPUs ($o) failed:"; tail -4 "$log"; }
  echo "[$((SECONDS - t0)) s] $(grep -a "iteration .*/" "$log" | tail -1 | cut -c1-150)"
  grep -a "(exposed)" "$log" | tail -1 | sed "s/^ */  profiled: /"
}
reference() {  # model nproc mode
  local m=$1 n=$2 mode=$3 log=$out/$1.$2.ref_$3.log
  local args=(--model "$m" --mode "$mode" --micro "${ME_BENCH_MICRO:-4}" --steps "$ME_BENCH_STEPS"
              --warmup "$ME_BENCH_WARMUP" --peak-tflops "$peak" --json "$rows" --text "$text") t0=$SECONDS
  late "reference $m $mode on $n GPUs" && return 0
  if [ "$n" -eq 1 ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 400 python3 "$repo/bench/reference/train_ref.py" "${args[@]}" > "$log" 2>&1
  else
    timeout 400 python3 -m torch.distributed.run --standalone --nproc_per_node "$n" \
      "$repo/bench/reference/train_ref.py" "${args[@]}" > "$log" 2>&1
  fi || { echo "reference $m $mode on $n GPUs failed:"; tail -4 "$log"; }
  echo "[$((SECONDS - t0)) s] $(grep -a "tokens/s" "$log" | tail -1 | cut -c1-150)"
}
ref_nproc=${ME_BENCH_REF_NPROC:-1$([ "$ngpu" -ge 2 ] && echo " $ngpu")}
for m in $models; do
  echo "== $m"
  row "$m" 1 ""
  [ "$ngpu" -ge 2 ] && row "$m" "$ngpu" ""
  [ "$ngpu" -ge 2 ] && [ "${ME_BENCH_SKIP_DISTOPT:-0}" != 1 ] && row "$m" "$ngpu" "parallel.distributed_optimizer=true"
  for mode in ${ME_BENCH_REF-compile}; do
    for n in $ref_nproc; do
      [ "$n" -le "$ngpu" ] && reference "$m" "$n" "$mode"
    done
  done
  # Extra data-parallel rows: recipe overrides (rows separated by ';') and environment (e.g. NCCL
  # settings, for every extra row) to compare.
  if [ "$ngpu" -ge 2 ] && [ -n "${ME_BENCH_DP_EXTRA:-}${ME_BENCH_DP_EXTRA_ENV:-}" ]; then
    IFS=';' read -ra extras <<< "${ME_BENCH_DP_EXTRA:-}"
    [ ${#extras[@]} -eq 0 ] && extras=("")
    for extra in "${extras[@]}"; do
      (export ME_BENCH_LABEL="$extra ${ME_BENCH_DP_EXTRA_ENV:-}"
       for kv in ${ME_BENCH_DP_EXTRA_ENV:-}; do export "$kv"; done
       row "$m" "$ngpu" "$extra")
    done
  fi
  [ "$ngpu" -ge 2 ] && [ "${ME_BENCH_SKIP_TP:-0}" != 1 ] && row "$m" 2 "parallel.tp=2 parallel.sequence_parallel=true"
  # A second tp=2 row with other settings (e.g. parallel.tp_symmetric_mb=4096).
  [ "$ngpu" -ge 2 ] && [ -n "${ME_BENCH_TP_EXTRA:-}" ] &&
    (export ME_BENCH_LABEL="$ME_BENCH_TP_EXTRA"; row "$m" 2 "parallel.tp=2 parallel.sequence_parallel=true $ME_BENCH_TP_EXTRA")
  if [ -n "${ME_BENCH_ROWS:-}" ]; then
    IFS=';' read -ra more <<< "$ME_BENCH_ROWS"
    for r in "${more[@]}"; do
      n=${r%%:*}
      [ "$n" -le "$ngpu" ] && row "$m" "$n" "${r#*:}"
    done
  fi
  if [ "$ngpu" -ge 2 ] && [ "${ME_BENCH_SKIP_PP:-0}" != 1 ]; then
    micro=${ME_BENCH_MICRO:-4}
    # The stages balanced by FLOPs: the last one also holds the output layer, so the first takes
    # one layer more (13/11 for GPT 1.3B: +4.4% over an even split, bench/RESULTS.md).
    # ME_BENCH_PP_FIRST=N: the first stage's layers instead (0: an even split).
    split="parallel.pp_split=balanced"
    [ -n "${ME_BENCH_PP_FIRST:-}" ] && split="parallel.pp_first_layers=$ME_BENCH_PP_FIRST"
    pp="parallel.pp=2 $split batch.global=$((16 * micro))"
    row "$m" 2 "$pp"
    [ "$ngpu" -ge 4 ] && row "$m" 4 "$pp"
  fi
done
python3 "$repo/bench/speed/table.py" "$rows" | tee "$out/table.md"
python3 - "$rows" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"engine"' in l]
def pipeline_bubble(r):  # 1F1B's idle share per stage: (pp - 1) / (micro-batches + pp - 1)
    pp = re.search(r"pp=(\d+)", r["layout"])
    if not pp or not r.get("accum"):
        return ""
    p, m = int(pp.group(1)), int(r["accum"])
    return f"; 1F1B bubble {100 * (p - 1) / (m + p - 1):.1f}% of a step ({m} micro-batches, before deferred wgrads fill it)"
for r in rows:
    one = [x for x in rows if x["model"] == r["model"] and x["engine"] == r["engine"] and x["layout"] == "1 GPU"
           and x.get("tokens_per_s")]
    if not one or r["layout"] == "1 GPU" or not r.get("tokens_per_s"):
        continue
    n = int(r["layout"].split()[0])
    print(f'{r["model"]} {r["engine"]} {r["layout"]}: {r["tokens_per_s"] / n:,.0f} tokens/s per GPU = '
          f'{100 * r["tokens_per_s"] / n / one[0]["tokens_per_s"]:.1f}% of one GPU ({one[0]["tokens_per_s"]:,.0f})'
          + pipeline_bubble(r))
PY
