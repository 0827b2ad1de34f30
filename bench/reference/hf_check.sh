#!/usr/bin/env bash
# megaengine against Hugging Face transformers itself, on the GPU machine (python3 with torch,
# transformers and safetensors; no network), from the repository root:
#   bash bench/reference/hf_check.sh MEGAENGINE [OUT]      (OUT: /tmp/hf_check by default)
# (a) a tiny GPT and a tiny LLaMA (GQA, RoPE) trained 6 steps by megaengine on the GPU in fp32 and
#     in bf16, exported with me.hf.export(trainer, ...), loaded with
#     AutoModelForCausalLM.from_pretrained (nothing missing, unexpected or mismatched): logits on
#     the same ids within 1e-4 relative (fp32) or 3e-2 (bf16);
# (b) a random LlamaForCausalLM (hidden 512, 8 heads, 2 key/value heads, 4 layers, vocab 32000)
#     saved with save_pretrained and loaded by megaengine through checkpoint.load = "hf:DIR":
#     logits, the loss of a training step on a fixed batch and that loss's gradient norm within
#     1e-4 relative.
# Prints a PASS/FAIL table (also OUT/hf_check.json; every step's log in OUT/*.log) and exits 1
# when a check or a step fails. ME_HFC_DEVICE=cpu runs megaengine's side without a GPU.
set -uo pipefail
bin=${1:?usage: bash bench/reference/hf_check.sh MEGAENGINE [OUT]}
out=${2:-/tmp/hf_check}
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$bin" ] || { echo "hf_check: FAIL: '$bin' is not an executable megaengine"; exit 1; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
if [ -e "$out" ] && [ -n "$(ls -A "$out")" ] && [ ! -f "$out/tokens_small.txt" ]; then
  echo "hf_check: FAIL: '$out' is not empty and not an earlier hf_check's output: give another OUT"
  exit 1
fi
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 ME_HFC_DEVICE=${ME_HFC_DEVICE:-cuda} ME_HFC_TEXT=$out/text.txt
start=$(date +%s)
failed_steps=()

run() {  # log command...: the command's output into OUT/log; its tail shown if it fails
  local log=$out/$1
  shift
  if ! timeout 900 "$@" > "$log" 2>&1; then
    echo "hf_check: step FAILED: $* (log: $log)"
    tail -30 "$log" | sed 's/^/    /'
    failed_steps+=("$(basename "$log" .log)")
    return 1
  fi
  grep -h "^hf_check" "$log" || true
}

run prepare.log "$python" "$here/hf_check.py" prepare --out "$out" || exit 1
for precision in fp32 bf16; do
  for model in gpt llama; do
    mkdir -p "$out/$model-$precision"
    run "train-$model-$precision.log" env ME_HFC_MODE=train ME_HFC_MODEL=$model ME_HFC_PRECISION=$precision \
      ME_HFC_DIR="$out/$model-$precision" ME_HFC_TOKENS="$out/tokens_small.txt" "$bin" "$here/hf_check.lua"
  done
done
if run make-llama.log "$python" "$here/hf_check.py" make-llama --out "$out/hf_random"; then
  mkdir -p "$out/import"
  run import.log env ME_HFC_MODE=import ME_HFC_HF="$out/hf_random" ME_HFC_DIR="$out/import" \
    ME_HFC_TOKENS="$out/tokens_import.txt" "$bin" "$here/hf_check.lua"
fi
# compare prints the table (a step that failed above shows as a FAIL row: its file is missing).
"$python" "$here/hf_check.py" compare --out "$out" 2>&1 | tee "$out/compare.log"
status=${PIPESTATUS[0]}
echo "hf_check: done in $(( $(date +%s) - start )) s; logs in $out"
if [ ${#failed_steps[@]} -gt 0 ]; then
  echo "hf_check: FAIL: steps that failed: ${failed_steps[*]}"
  exit 1
fi
[ "$status" -eq 0 ] || { echo "hf_check: FAIL"; exit 1; }
echo "hf_check: PASS"
