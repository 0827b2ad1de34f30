#!/usr/bin/env bash
# The user's cluster layouts end to end on the CPU: recipes/gpt39b.lua at tp 4 x pp 2 x dp 2 and
# recipes/llama2_70b.lua at tp 4 x pp 4 with sequence parallelism (and its full recomputation),
# each on 16 processes, unchanged but for overrides that shrink the width and depth, the batch
# and the run (3 iterations, the header's benchmark mode), on tiny data laid out under a
# temporary DATA_PATH as the recipes expect it: Moby Dick tokenized with GPT-2 (the fetched
# assets) or with a 512-piece SentencePiece model trained here. Passes when every rank
# finished and the loss fell from the first iteration to the third.
#   tests/cli/cluster_recipes.sh MEGAENGINE gpt39b|llama2_70b
set -euo pipefail
bin=$1
which=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
assets=${ME_ASSET_DIR:-$repo/assets}
export DATA_PATH
DATA_PATH=$(mktemp -d)
trap 'rm -rf "$DATA_PATH"' EXIT

case $which in
  gpt39b)
    mkdir -p "$DATA_PATH/gpt2"
    # tokenized here (a second), not linked from the assets: on a fresh clone those exist only
    # once a gpt_tiny run has made them, and CTest may start this test first
    "$bin" preprocess --input "$assets/moby-dick.txt" --input-format text --output-prefix "$DATA_PATH/gpt2/my-gpt2" \
      --tokenizer gpt2 --vocab-file "$assets/gpt2-encoder.json" --merge-file "$assets/gpt2-vocab.bpe" --append-eod \
      --no-progress > "$DATA_PATH/preprocess.log" 2>&1 || { cat "$DATA_PATH/preprocess.log"; exit 1; }
    ln -s "$assets/gpt2-encoder.json" "$DATA_PATH/gpt2/gpt2-vocab.json"
    ln -s "$assets/gpt2-vocab.bpe" "$DATA_PATH/gpt2/gpt2-merges.txt"
    shrink=(model.layers=4 model.hidden=64 model.heads=4 model.seq=64)
    ;;
  llama2_70b)
    mkdir -p "$DATA_PATH/llama2"
    spm_train --input="$assets/moby-dick.txt" --model_prefix="$DATA_PATH/llama2/tokenizer" --vocab_size=512 \
      --model_type=bpe --character_coverage=1.0 --input_sentence_size=20000 --shuffle_input_sentence=true \
      --minloglevel=2 > "$DATA_PATH/spm.log" 2>&1 || { cat "$DATA_PATH/spm.log"; exit 1; }
    "$bin" preprocess --input "$assets/moby-dick.txt" --input-format text --output-prefix "$DATA_PATH/llama2/my-llama2" \
      --tokenizer sentencepiece --tokenizer-model "$DATA_PATH/llama2/tokenizer.model" --append-eod --no-progress \
      > "$DATA_PATH/preprocess.log" 2>&1 || { cat "$DATA_PATH/preprocess.log"; exit 1; }
    # 4 stages of one layer; 8 query heads in 4 key/value groups (2 per tp rank), SwiGLU 128 wide.
    # The recipe keeps gradients in bf16 for the GPU; fp32 training here keeps them in fp32.
    shrink=(model.layers=4 model.hidden=64 model.heads=8 model.query_groups=4 model.ffn_hidden=128 model.seq=64
            model.vocab=512 parallel.grad_reduce_dtype=fp32)
    ;;
  *) echo "usage: $0 MEGAENGINE gpt39b|llama2_70b" >&2; exit 2 ;;
esac

log=$DATA_PATH/run.log
# The header's "iterations instead of samples" and "benchmark mode" overrides, a global batch of
# 8 (4 micro-batches per pipeline), a learning rate a tiny model learns from in 3 steps.
if ! timeout 400 "$bin" --nproc 16 "$repo/recipes/$which.lua" device=cpu precision=fp32 "${shrink[@]}" \
    batch.global=8 train.samples=0 train.iters=3 schedule.decay_samples=0 schedule.warmup_samples=0 \
    schedule.decay_iters=3 schedule.warmup_iters=0 train.eval_iters=0 data.split=100,0,0 train.log_interval=1 \
    optimizer.lr=1e-2 schedule.min_lr=1e-3 comm.timeout_s=300 > "$log" 2>&1; then
  echo "FAILED: recipes/$which.lua did not train on 16 processes:"
  tail -40 "$log"
  exit 1
fi
grep -a "layout: world 16" "$log" | head -1
mapfile -t losses < <(grep -aE "^\[rank 0\]  iteration +[0-9]+/" "$log" | sed -E 's/.*lm loss: ([0-9.E+-]+).*/\1/')
if [ "${#losses[@]}" -ne 3 ]; then
  echo "FAILED: expected 3 progress lines from rank 0, got ${#losses[@]}:"
  tail -20 "$log"
  exit 1
fi
echo "recipes/$which.lua on 16 processes: loss ${losses[0]} -> ${losses[1]} -> ${losses[2]}"
if ! awk -v a="${losses[0]}" -v c="${losses[2]}" 'BEGIN { exit !(c < a) }'; then
  echo "FAILED: the loss did not fall"
  exit 1
fi
echo "cluster recipe $which passed"
