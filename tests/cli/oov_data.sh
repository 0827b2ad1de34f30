#!/usr/bin/env bash
# Data made for another vocabulary: one token id >= model.vocab in one document of a .bin must
# stop the run on the host with an error naming the .bin, the document, the id and the
# vocabulary, and saying what to do (not a device-side assert, not "index out of range").
#   oov_data.sh MEGAENGINE [override ...]   (e.g. device=cuda on the GPU machine)
set -euo pipefail
bin=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for i in $(seq 1 10); do printf '{"text": "document %d: Call me Ishmael. Some years ago, never mind how long."}\n' "$i"; done > "$tmp/in.jsonl"
"$bin" preprocess --input "$tmp/in.jsonl" --output-prefix "$tmp/data" --tokenizer gpt2 --append-eod --no-progress
p=$tmp/data_text_document

# .idx: 9-byte magic, uint64 version, uint8 dtype, int64 sequences, int64 documents, then int32
# lengths and int64 byte offsets of the sequences. Token 2 of document 3 (one sequence per
# document here) becomes 65000 (uint16, little-endian), above GPT-2's 50257.
count=$(od -An -t d8 -j 18 -N 8 "$p.idx" | tr -d ' ')
offset=$(od -An -t d8 -j $((34 + 4 * count + 8 * 3)) -N 8 "$p.idx" | tr -d ' ')
printf '\xe8\xfd' | dd of="$p.bin" bs=1 seek=$((offset + 2 * 2)) conv=notrunc status=none

ME_DATA_PREFIX=$p bash "$here/expect.sh" fail \
  "data: token id 65000 in '$p.bin' \(document 3, sequence 3, token 2; sample [0-9]+\) is outside the model's vocabulary of 50257 ids \(model.vocab\)\. The data was tokenized with another tokenizer than the model's: preprocess it again .*set model.vocab to its vocabulary size \(at least 65001\)" \
  -- "$bin" "$here/gpt_data.lua" train.iters=20 train.eval_iters=0 data.split=100,0,0 "$@"
echo "oov_data: the out-of-vocabulary id is named with its file and document"
