#!/usr/bin/env bash
# Tensor parallelism at the user's widths (issue #35), in one device call: the marginal time of
# a transformer layer (layers L and 2L, so that the embedding and the output layer cancel) at
# tp 1 (one GPU), tp 2 and tp 4, for each variant (by default: sequence parallelism with the
# default backend, "auto", the copy engines on one node, and no SP; with ME_BENCH_NCCL_ROW=1 also
# SP with NCCL; others through
# ME_BENCH_VARIANTS, e.g. parallel.tp_gather=ring or NCCL_PROTO=Simple); per-GPU efficiency = the tp 1 layer
# time / (tp x the layer time at tp); the exposed TP communication per layer from the step
# profile (train.profile_at, during the warm-up, so that it slows no timed step) of each 2L
# run, and from every rank's trace of it which ranks are host-bound (bench/speed/trace_ranks.py,
# its report at the end of the run's log). GPT-39B width (h 8192, 64 heads, seq 2048) and LLaMA-2-70B width (GQA 8, ffn 28672,
# seq 4096); micro 1, global 8, bf16, the recipes' defaults (ME_BENCH_MICRO_BATCH=m: micro m,
# global 8 x m, the same 8 micro-batches a step).
#   source .debs/device-env.sh && bash bench/speed/tp_width.sh OUT_DIR [gpt39b-2l llama70b-2l]
# Environment: ME_BENCH_BUILD (/tmp/b; built here when it has no megaengine), ME_BENCH_L (1),
# ME_BENCH_TPS ("2 4"), ME_BENCH_MICRO_BATCH (1), ME_BENCH_STEPS (16: four timed windows of 4), ME_BENCH_WARMUP (4), ME_BENCH_DEADLINE_S (500),
# ME_BENCH_VARIANTS ("label:overrides;..."; an override NCCL_X=v, CUDA_VISIBLE_DEVICES=v or ME_X=v is set in the environment),
# ME_BENCH_TORCH_REF (1: also plain PyTorch's layer at tp 1 and each tp, bench/reference/tp_layer_ref.py,
# its variants in ME_BENCH_TORCH_VARIANTS, default "sp,sp-graph"; rows "PyTorch ..." against its own tp 1,
# in the same units: a micro-batch's time x 8), ME_BENCH_KEEP_TRACES (1: every rank's trace of each
# tp > 1 run, as OUT_DIR/traces-*.tgz, for bench/speed/trace_ranks.py elsewhere; "all": tp 1 too), ME_BENCH_TP1_EACH_GPU
# (1: tp 1's layer on every other GPU too, against GPU 0's: a tp group runs at its slowest GPU's pace),
# ME_BENCH_SKIP_TP1 (1: no tp 1 runs and no efficiencies, for an A/B of variants in less device time).
# ME_BENCH_CLOCKS=MS: each row also gives its 2L run's SM clock (nvidia-smi every MS ms; the median
# while busy, of its slowest GPU): session 24 saw a run's two timed windows 12% apart and the same
# code 4 points apart on two machines. Off by default: the sampler's NVML queries run beside the
# timed steps, and every tp > 1 row of session 26 that had it (tp 2: 0.90 in three calls, against
# 0.92-0.93 in sessions 21 and 24; tp 4: 0.70 with one rank's host far behind) came out lower.
# The last three columns: with the copy engines, each rank's GPU time per step in the reduce-scatters'
# waits (for the other ranks; counted on the GPU by the wait kernel, so unprofiled, from the 2L
# run's last log window), min/median/max over ranks, and the rank that waits least; then each
# rank's host time per step blocked at the gradient norm (waiting for its GPU), likewise: near 0
# for the least waiting rank, that rank's host sets the step's pace; then each host's lead over
# its GPU where it queues a micro-batch (its median over the window), likewise.
# OUT_DIR ends with table.md, rows.jsonl and logs.tgz.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$1
shift
models=${*:-gpt39b-2l llama70b-2l}
build=${ME_BENCH_BUILD:-/tmp/b}
L=${ME_BENCH_L:-1}
micro=${ME_BENCH_MICRO_BATCH:-1}
deadline=${ME_BENCH_DEADLINE_S:-500}
mkdir -p "$out/logs"
t0=$SECONDS
if [ ! -x "$build/megaengine" ]; then
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > "$out/logs/cmake.log" 2>&1 &&
    cmake --build "$build" --target megaengine > "$out/logs/build.log" 2>&1 ||
    { grep -E "error" -A3 "$out/logs/build.log" | head -40; exit 1; }
  echo "built in $((SECONDS - t0)) s"
fi
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
rows=$out/rows.jsonl
: > "$rows"

warmup=${ME_BENCH_WARMUP:-4}
[ "$warmup" -ge 4 ] || { echo "ME_BENCH_WARMUP must be >= 4 (the profile runs in the warm-up)"; exit 2; }

# The GPUs' SM clocks while a run is busy (ME_BENCH_CLOCKS: sampled every that many ms): a GPU that
# throttles for power or heat moves a row's figure between runs and machines, and this says
# whether it did.
clock_summary() {  # SAMPLES_CSV GPU... -> "MHz g:MHz g:MHz ..." (median over busy samples: the lowest
  # GPU's, then each GPU's: a GPU slower than the others paces them) or "-"
  local csv=$1
  shift
  python3 - "$csv" "$@" <<'PY'
import statistics, sys
gpus = set(sys.argv[2:])
by_gpu = {}
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(",")]
    if len(f) < 3 or f[0] not in gpus:
        continue
    try:
        util, mhz = float(f[1]), float(f[2])
    except ValueError:
        continue
    if util >= 50:  # the GPU was working: warm-up, timed steps and the profile alike
        by_gpu.setdefault(f[0], []).append(mhz)
each = {g: int(statistics.median(v)) for g, v in by_gpu.items()}
print(" ".join([str(min(each.values()))] + [f"{g}:{each[g]}" for g in sorted(each, key=int)]) if each else "-")
PY
}

# spread_over_ranks WHAT LOG -> "min/median/max,rankR" of the log's last "WHAT over ranks
# (min/median/max): a/b/c (min: rank R)" (a progress line's figure gathered over ranks), or nothing
spread_over_ranks() {
  sed -n "s|.*$1 over ranks (min/median/max): \([0-9./]*\) (min: rank \([0-9]*\)).*|\1,rank\2|p" "$2" | tail -1
}

# run MODEL LAYERS TP LABEL OVERRIDES... -> "ms exposed hostbound MHz waits hostwaits best leads": ms per
# step (median window), exposed comm ms per step, host-bound ranks, SM MHz, the progress line's
# spreads over ranks, the fastest window's ms per step
run() {
  local model=$1 layers=$2 tp=$3 label=$4
  shift 4
  local log="$out/logs/$model-L$layers-tp$tp-$label.log" launch=() env=() overrides=() o
  local trace="${TMPDIR:-/tmp}/tp_width.$$.trace.json"
  for o in "$@"; do
    case $o in NCCL_*=* | CUDA_*=* | ME_*=*) env+=("$o") ;; *) overrides+=("$o") ;; esac
  done
  [ "$tp" -gt 1 ] && launch=(--nproc "$tp")
  # The step profile gives the exposed NCCL time and the host-bound ranks, both tp > 1 columns: tp 1
  # runs without it (its trace is written and parsed for nothing) unless its trace is kept.
  # With train.cuda_graphs the second step captures the graphs: the profile starts a step later.
  local at=2
  case " $* " in *" train.cuda_graphs=true "*) at=3 ;; esac
  local profile="train.profile_at=$at train.profile_steps=2 train.profile_trace=$trace"
  [ "$tp" -eq 1 ] && [ "${ME_BENCH_KEEP_TRACES:-}" != all ] && profile=""
  if [ $((SECONDS - t0)) -gt "$deadline" ]; then echo "skipped (deadline)"; return; fi
  env "${env[@]}" ME_BENCH_MODEL=$model ME_BENCH_MICRO=$micro ME_BENCH_STEPS=${ME_BENCH_STEPS:-16} ME_BENCH_WARMUP=$warmup \
    ME_BENCH_JSON=$rows ME_BENCH_LABEL="L$layers $label" \
    ME_BENCH_OVERRIDES="model.layers=$layers batch.global=$((8 * micro)) parallel.tp=$tp ${overrides[*]} $profile" \
    timeout 300 "$build/megaengine" "${launch[@]}" "$repo/bench/speed/megaengine_row.lua" > "$log" 2>&1 &
  local job=$! sampler= mhz=- apps=
  # Which processes hold each GPU, once, 15 s in: a rank with a CUDA context on another rank's GPU
  # (a thread of it that used CUDA before choosing its device) would show as a second process
  # there, and any work it queued there would time-slice with that rank's (a tp group runs at its
  # slowest GPU's pace: rank 0 was the slowest in every row of the thirty-second session).
  if [ "$tp" -gt 1 ]; then
    (sleep 15 && kill -0 "$job" 2>/dev/null &&
      nvidia-smi --query-compute-apps=gpu_bus_id,pid,used_memory --format=csv,noheader > "$log.apps" 2>/dev/null) &
    apps=$!
  fi
  if [ -n "${ME_BENCH_CLOCKS:-}" ]; then
    nvidia-smi --query-gpu=index,utilization.gpu,clocks.sm,power.draw,timestamp --format=csv,noheader,nounits -lms "$ME_BENCH_CLOCKS" > "$log.clocks" 2>/dev/null &
    sampler=$!
  fi
  wait "$job"
  if [ -n "$apps" ]; then
    kill "$apps" 2>/dev/null
    wait "$apps" 2>/dev/null
    [ -s "$log.apps" ] && echo "GPU processes 15 s in (bus id: processes): $(cut -d, -f1 "$log.apps" | sort | uniq -c | awk '{printf "%s: %s  ", $2, $1}')" >> "$log"
  fi
  if [ -n "$sampler" ]; then
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    local used=() g visible=
    for o in "${env[@]}"; do [[ $o == CUDA_VISIBLE_DEVICES=* ]] && visible=${o#*=}; done
    if [ -n "$visible" ]; then IFS=, read -ra used <<< "$visible"; else for ((g = 0; g < tp; g++)); do used+=("$g"); done; fi
    local clocks
    clocks=$(clock_summary "$log.clocks" "${used[@]}")
    mhz=${clocks%% *}
    echo "SM clock while busy: $mhz MHz (median per GPU, the lowest of GPUs ${used[*]}; each: ${clocks#* })" >> "$log"
    # The samples stay beside the log (logs.tgz), with each GPU's power draw and a timestamp: a
    # slow window's clock or power dip, GPU by GPU.
  fi
  # Every rank's trace of the profiled steps: which rank the others wait for (host-bound ones
  # start their kernels microseconds after launching them); the traces themselves are dropped.
  local ms exposed hostbound=-
  if [ "$tp" -gt 1 ] && [ -f "$trace" ]; then
    python3 "$repo/bench/speed/trace_ranks.py" "$trace" >> "$log" 2>&1
    hostbound=$(sed -n 's/^host-bound .*: rank(s) //p' "$log" | tail -1)
  fi
  if [ -f "$trace" ] && { [ "${ME_BENCH_KEEP_TRACES:-}" = all ] || { [ -n "${ME_BENCH_KEEP_TRACES:-}" ] && [ "$tp" -gt 1 ]; }; }; then  # for trace_ranks.py later
    tar czf "$out/traces-$model-L$layers-tp$tp-$label.tgz" -C "$(dirname "$trace")" $(cd "$(dirname "$trace")" && ls "$(basename "${trace%.json}")"*.json)
  fi
  rm -f "${trace%.json}"*.json
  ms=$(grep -o '"ms_per_step": [0-9.]*' "$log" | tail -1 | grep -o '[0-9.]*$')
  # The fastest timed window's ms per step (the first window holds the warm-up and the profile):
  # at tp 4 one window in three or four runs 10-20% slower than the rest (thirty-first session),
  # and the marginal layer of the median windows carries that; the fastest windows' is the
  # steady state without it.
  local best
  best=$(grep -o 'elapsed time per iteration (ms): [0-9.]*' "$log" | tail -n +2 | awk '{v = $NF + 0; if (b == "" || v < b) b = v} END {print b}')
  exposed=$(grep -o 'of which [0-9.]* ms beside no other kernel' "$log" | head -1 | grep -o '[0-9.]*')
  # On the copy engines the layer's collectives are copies and barriers, not NCCL kernels: the
  # profile's exposed NCCL time is the embedding's and output layer's, which L and 2L share.
  grep -q "collectives on the copy engines" "$log" && exposed=ce
  hostbound=${hostbound// /}
  # The copy engines' reduce-scatter barriers: each rank's GPU time per step waiting there for the
  # others (unprofiled: the last log window), min/median/max over ranks, and the rank that waits least.
  local waits
  waits=$(spread_over_ranks "GPU ms waiting at TP barriers" "$log")
  # Each host's time per step blocked at the gradient norm, waiting for its GPU (the last log
  # window, unprofiled): near 0 on the rank whose host sets the pace.
  local host_waits
  host_waits=$(spread_over_ranks "host ms waiting for its GPU" "$log")
  # Each host's lead over its GPU where it queues a micro-batch (the median over the window's
  # marks), likewise: near 0 for a rank whose host is behind its GPU through the step.
  local leads
  leads=$(spread_over_ranks "host ms ahead of its GPU at micro-batches (each rank's median)" "$log")
  # ... and the least single lead, where it was: ",least:MS@rankR:mbK-forward" (no spaces: one field)
  local least
  least=$(sed -n "s/.*least of all \([0-9.]*\) (rank \([0-9]*\), micro-batch \([0-9]*\)'s \([a-z]*\)).*/\1@rank\2:mb\3-\4/p" "$log" | tail -1)
  [ -n "$leads" ] && [ -n "$least" ] && leads="$leads,least:$least"
  echo "${ms:-nan} ${exposed:-0} ${hostbound:--} $mhz ${waits:--} ${host_waits:--} ${best:-nan} ${leads:--}"
}

# measured A B: both runs gave a time (not skipped at the deadline, not failed)
measured() { [[ $1 =~ ^[0-9.]+$ && $2 =~ ^[0-9.]+$ ]]; }

# runs MODEL LABEL TP OVERRIDES... -> "a e1 b e2 hostbound MHz waits hostwaits best leads": run's figures at
# L and 2L layers (host-bound ranks, the SM clock, the barrier waits, the hosts' waits and their
# leads: the 2L run's; best: the ms per layer from the two runs' fastest windows)
runs() {
  local model=$1 label=$2 tp=$3 a e1 b e2 hb mhz waits hw fa fb leads
  shift 3
  read -r a e1 _ _ _ _ fa _ <<< "$(run "$model" "$L" "$tp" "$label" "$@")"
  read -r b e2 hb mhz waits hw fb leads _ <<< "$(run "$model" $((2 * L)) "$tp" "$label" "$@")"
  local best=-
  measured "$fa" "$fb" && best=$(awk -v a="$fa" -v b="$fb" -v l="$L" 'BEGIN { printf "%.1f", (b - a) / l }')
  echo "$a $e1 $b $e2 ${hb:--} ${mhz:--} ${waits:--} ${hw:--} $best ${leads:--}"
}

# Plain PyTorch's layer of MODEL's width at tp 1 and each tp (bench/reference/tp_layer_ref.py), as rows
torch_reference() {
  local model=$1 width=${1%-2l} tp ref=$out/torch_ref.jsonl
  : > "$ref"
  for tp in 1 ${ME_BENCH_TPS:-2 4}; do
    [ "$tp" -le "$gpus" ] || continue
    if [ $((SECONDS - t0)) -gt "$deadline" ]; then echo "PyTorch tp $tp skipped (deadline)"; continue; fi
    local launch=(python3)
    [ "$tp" -gt 1 ] && launch=(python3 -m torch.distributed.run --standalone --nproc_per_node "$tp")
    timeout 200 "${launch[@]}" "$repo/bench/reference/tp_layer_ref.py" --width "$width" --layers "$L" \
      --micro "$micro" --variants "${ME_BENCH_TORCH_VARIANTS:-sp,sp-graph}" --json "$ref" > "$out/logs/$model-torch-tp$tp.log" 2>&1
  done
  python3 - "$ref" "$model" >> "$out/table.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {r["variant"]: r["ms_per_layer"] for r in rows if r["tp"] == 1}
for r in rows:
    b = base.get(r["variant"])
    eff = f'{b / (r["tp"] * r["ms_per_layer"]):.2f}' if b else "-"
    print(f'| {sys.argv[2]} | PyTorch {r["variant"]}, tp {r["tp"]} | {8 * r["ms_per_layer"]:.1f} | {eff} | - | - | - | - | - | - | - |')
PY
}

# "SP" is the default backend (auto: the copy engines on one node), "no SP" NCCL's all-reduce (its
# exposed time is the profile's column); ME_BENCH_NCCL_ROW=1 adds "SP nccl", NCCL's bulk gathers
# (two more runs a tp and width: without them both widths' table fits one device call).
variants=${ME_BENCH_VARIANTS:-"SP:parallel.sequence_parallel=true;no SP:parallel.sequence_parallel=false"}
[ -z "${ME_BENCH_VARIANTS:-}" ] && [ -n "${ME_BENCH_NCCL_ROW:-}" ] &&
  variants="$variants;SP nccl:parallel.sequence_parallel=true parallel.tp_comm_backend=nccl"
{
  echo "| width | layout | ms per layer (step) | per-GPU efficiency | the same from each run's fastest window | exposed TP comm per layer (ms per step) | host-bound ranks (2L run) | SM MHz (2L run) | GPU ms per step at TP barriers, min/median/max, least waiting (2L run) | host ms per step waiting for its GPU, min/median/max, least waiting (2L run) | host ms ahead of its GPU at micro-batches (each rank's median), min/median/max, least (2L run) |"
  echo "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
} > "$out/table.md"
for model in $models; do
  if [ -n "${ME_BENCH_SKIP_TP1:-}" ]; then
    base=- base_best=-
  else
    read -r a _ b _ _ mhz _ _ base_best _ <<< "$(runs "$model" tp1 1)"
    base=$(awk -v a="$a" -v b="$b" -v l="$L" 'BEGIN { print (b - a) / l }')
    echo "| $model | tp 1 | $base | 1.00 | $base_best, 1.00 | - | - | $mhz | - | - | - |" >> "$out/table.md"
  fi
  # A tp group runs at its slowest GPU's pace: the same layer on each other GPU says whether GPU 0
  # (tp 1's) is faster than the rest (the efficiencies below are against GPU 0).
  if [ -n "${ME_BENCH_TP1_EACH_GPU:-}" ]; then
    for g in $(seq 1 $((gpus - 1))); do
      read -r a _ b _ _ mhz _ _ best _ <<< "$(runs "$model" "tp1-gpu$g" 1 CUDA_VISIBLE_DEVICES=$g)"
      measured "$a" "$b" || { echo "| $model | tp 1 on GPU $g | not measured | - | - | - | - | - | - | - | - |" >> "$out/table.md"; continue; }
      awk -v a="$a" -v b="$b" -v l="$L" -v base="$base" -v m="$model" -v g="$g" -v mhz="$mhz" -v best="$best" 'BEGIN {
        printf "| %s | tp 1 on GPU %d | %.1f | %.2f of GPU 0 | %s | - | - | %s | - | - | - |\n", m, g, (b - a) / l, base / ((b - a) / l), best, mhz }' >> "$out/table.md"
    done
  fi
  for tp in ${ME_BENCH_TPS:-2 4}; do
    [ "$tp" -le "$gpus" ] || continue
    IFS=';' read -ra list <<< "$variants"
    for variant in "${list[@]}"; do
      label=${variant%%:*} overrides=${variant#*:}
      read -r a e1 b e2 hb mhz waits hw best leads <<< "$(runs "$model" "${label// /_}" "$tp" $overrides)"
      if ! measured "$a" "$b"; then  # skipped at the deadline, or failed
        echo "| $model | tp $tp + $label | not measured ($a, $b) | - | - | - | - | - | - | - | - |" >> "$out/table.md"
        continue
      fi
      awk -v a="$a" -v b="$b" -v l="$L" -v base="$base" -v tp="$tp" -v e1="$e1" -v e2="$e2" -v m="$model" -v lab="$label" -v hb="$hb" -v mhz="$mhz" -v waits="$waits" -v hw="$hw" -v best="$best" -v base_best="$base_best" -v leads="$leads" 'BEGIN {
        layer = (b - a) / l
        exposed = (e1 == "ce" || e2 == "ce") ? "- (copy engines)" : sprintf("%.1f", (e2 - e1) / l)
        eff = base == "-" ? "-" : sprintf("%.2f", base / (tp * layer))
        fastest = best == "-" ? "-" : (base_best == "-" ? best : sprintf("%s, %.2f", best, base_best / (tp * best)))
        printf "| %s | tp %d + %s | %.1f | %s | %s | %s | %s | %s | %s | %s | %s |\n", m, tp, lab, layer, eff, fastest, exposed, hb, mhz, waits, hw, leads }' >> "$out/table.md"
    done
  done
  [ -n "${ME_BENCH_TORCH_REF:-}" ] && torch_reference "$model"
done
cat "$out/table.md"
echo "whole call: $((SECONDS - t0)) s"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
