#!/usr/bin/env bash
# megaengine against Hugging Face transformers itself, on the GPU machine (torch, transformers and
# safetensors installed; no network), given a built megaengine:
#   bash bench/reference/hf_check.sh BUILD OUT
# (a) a tiny GPT and a tiny LLaMA (GQA, RoPE) trained 6 steps by megaengine on the GPU in fp32 and
#     in bf16, exported with me.hf.export(trainer, ...), loaded with
#     AutoModelForCausalLM.from_pretrained: logits on the same ids within 1e-4 relative (fp32) or
#     3e-2 (bf16);
# (b) a random LlamaForCausalLM (hidden 512, 8 heads, 2 key/value heads, 4 layers, vocab 32000)
#     saved with save_pretrained and loaded by megaengine through checkpoint.load = "hf:DIR":
#     logits, the loss on a fixed batch and that loss's gradient norm within 1e-4 relative.
# Results: one line per check, OUT/hf_check.json, OUT/*.log. ME_HFC_DEVICE=cpu runs it without a GPU.
set -euo pipefail
build=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
bin=$build/megaengine
[ -x "$bin" ] || { echo "hf_check: no megaengine in $build"; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 ME_HFC_DEVICE=${ME_HFC_DEVICE:-cuda} ME_HFC_TEXT=$out/text.txt
start=$(date +%s)

run() {  # log command...: the command's output into OUT/log, its tail shown if it fails
  local log=$out/$1
  shift
  if ! "$@" > "$log" 2>&1; then
    echo "hf_check: FAILED: $* (see $log)"
    tail -30 "$log"
    exit 1
  fi
  grep -h "^hf_check" "$log" || true
}

run prepare.log "$python" "$here/hf_check.py" prepare --out "$out"
for precision in fp32 bf16; do
  for model in gpt llama; do
    mkdir -p "$out/$model-$precision"
    run "train-$model-$precision.log" env ME_HFC_MODE=train ME_HFC_MODEL=$model ME_HFC_PRECISION=$precision \
      ME_HFC_DIR="$out/$model-$precision" ME_HFC_TOKENS="$out/tokens_small.txt" "$bin" "$here/hf_check.lua"
  done
done
run make-llama.log "$python" "$here/hf_check.py" make-llama --out "$out/hf_random"
mkdir -p "$out/import"
run import.log env ME_HFC_MODE=import ME_HFC_HF="$out/hf_random" ME_HFC_DIR="$out/import" \
  ME_HFC_TOKENS="$out/tokens_import.txt" "$bin" "$here/hf_check.lua"
run compare.log "$python" "$here/hf_check.py" compare --out "$out"
echo "hf_check: done in $(( $(date +%s) - start )) s"
