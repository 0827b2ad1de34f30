#!/usr/bin/env bash
# fp8 against bf16 on one GPU (issue #36, acceptance 1), one call, one binary: for each model
# megaengine in bf16 and in precision = "fp8", and torch.compile's bf16 reference beside them
# (bench/reference/train_ref.py), each row's MFU on the same bf16-equivalent model FLOPs against
# the measured bf16 matmul peak; then fp8 / bf16 and fp8 / torch.compile per model.
#   bash bench/fp8/speed.sh BUILD_DIR OUT_DIR        (after `source .debs/device-env.sh`)
# ME_FP8_MODELS: "model:micro ..." (default: GPT 1.3B and LLaMA 1B at micro 4, the GPT-39B and
# LLaMA-2-70B widths at 2 layers and micro 1, their recipes' sequence lengths);
# ME_FP8_GLOBAL=N: N samples per step (gradient accumulation over N / micro micro-batches, as a
# real run's large global batch: the optimizer's step over the whole model then weighs what it
# does in training, not once per micro-batch); ME_FP8_REFERENCE=0 skips torch.compile;
# ME_BENCH_STEPS / ME_BENCH_WARMUP as bench/speed/run.sh.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$1 out=$2
mkdir -p "$out"
rows=$out/rows.jsonl
export NCCL_NVLS_ENABLE=0 ME_BENCH_STEPS=${ME_BENCH_STEPS:-20} ME_BENCH_WARMUP=${ME_BENCH_WARMUP:-5}
text=${ME_ASSET_DIR:-$repo/assets}/moby-dick.txt
python3 "$repo/bench/reference/matmul_peak.py" --json "$rows" | tail -1
peak=$(python3 "$repo/bench/speed/table.py" --peak "$rows")
# train_ref.py's presets are the small models; the widths are given as overrides
declare -A ref_args=(
  [gpt1.3b]="--model gpt1.3b"
  [llama1b]="--model llama1b"
  [gpt39b-2l]="--model gpt1.3b --layers 2 --hidden 8192 --heads 64 --seq 2048"
  [llama70b-2l]="--model llama1b --layers 2 --hidden 8192 --heads 64 --groups 8 --ffn 28672 --seq 4096"
)
for spec in ${ME_FP8_MODELS:-gpt1.3b:4 llama1b:4 gpt39b-2l:1 llama70b-2l:1}; do
  m=${spec%:*} micro=${spec#*:}
  global=${ME_FP8_GLOBAL:-$micro}
  for precision in bf16 fp8; do
    log=$out/$m.$precision.log
    ME_BENCH_MODEL=$m ME_BENCH_MICRO=$micro ME_BENCH_PEAK=$peak ME_BENCH_OVERRIDES="precision=$precision batch.global=$global" \
      ME_BENCH_LABEL=$precision ME_BENCH_JSON=$rows "$build/megaengine" "$repo/bench/speed/megaengine_row.lua" > "$log" 2>&1 ||
      { echo "megaengine $m $precision failed:"; tail -5 "$log"; }
    grep -a "iteration .*/" "$log" | tail -1 | cut -c1-200
  done
  if [ "${ME_FP8_REFERENCE:-1}" != 0 ]; then
    # shellcheck disable=SC2086  # the preset and its overrides are words
    python3 "$repo/bench/reference/train_ref.py" ${ref_args[$m]} --mode compile --micro "$micro" --accum $((global / micro)) \
      --steps "$ME_BENCH_STEPS" --warmup "$ME_BENCH_WARMUP" --peak-tflops "$peak" --json "$out/ref.jsonl" --text "$text" \
      > "$out/$m.compile.log" 2>&1 || { echo "torch.compile $m failed:"; tail -5 "$out/$m.compile.log"; }
    # its row under this table's model name (the preset it was built from says less)
    [ -s "$out/ref.jsonl" ] && python3 -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l); r["model"] = sys.argv[2]; print(json.dumps(r))' "$out/ref.jsonl" "$m" >> "$rows"
    rm -f "$out/ref.jsonl"
  fi
done
python3 "$repo/bench/speed/table.py" "$rows" | tee "$out/table.md"
python3 - "$rows" <<'EOF' | tee "$out/ratios.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def rate(model, engine, label=None):
    for r in rows:
        if r.get("engine") == engine and r.get("model", "").startswith(model) and (label is None or r.get("layout", "").endswith(label)):
            return r
print("| model | bf16 tokens/s | fp8 tokens/s | fp8 / bf16 | torch.compile bf16 tokens/s | fp8 / compile | fp8 MFU | peak MiB bf16 -> fp8 |")
print("|---|--:|--:|--:|--:|--:|--:|--:|")
for m in dict.fromkeys(r.get("model") for r in rows if r.get("engine") == "megaengine"):
    b, f = rate(m, "megaengine", "bf16"), rate(m, "megaengine", "fp8")
    c = next((r for r in rows if r.get("engine") == "pytorch-compile" and r.get("model") == m and r.get("tokens_per_s")), None)
    if not (b and f):
        continue
    ct = c["tokens_per_s"] if c else float("nan")
    print(f"| {m} | {b['tokens_per_s']:.0f} | {f['tokens_per_s']:.0f} | {f['tokens_per_s'] / b['tokens_per_s']:.3f}x "
          f"| {ct:.0f} | {f['tokens_per_s'] / ct:.3f}x | {f.get('mfu', float('nan')):.3f} "
          f"| {b['peak_mem_mib']:.0f} -> {f['peak_mem_mib']:.0f} |")
EOF
