#!/usr/bin/env bash
# Damaged Megatron datasets given to a recipe: each is one clear error naming the file, a
# non-zero exit and no crash (expect.sh checks all three). The good copy must train.
#   corrupt_data.sh MEGAENGINE
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A valid dataset: 40 small documents through `megaengine preprocess`.
for i in $(seq 1 40); do printf '{"text": "document %d: Call me Ishmael. Some years ago, never mind how long."}\n' "$i"; done > "$tmp/in.jsonl"
"$bin" preprocess --input "$tmp/in.jsonl" --output-prefix "$tmp/good" --tokenizer gpt2 --append-eod --no-progress
good=$tmp/good_text_document

copy() {  # name -> a fresh copy of the good dataset under that name
  cp "$good.bin" "$tmp/$1.bin"
  cp "$good.idx" "$tmp/$1.idx"
  echo "$tmp/$1"
}
check() {  # mode regex prefix
  ME_DATA_PREFIX=$3 bash "$here/expect.sh" "$1" "$2" -- "$bin" "$here/gpt_data.lua"
}

check ok "iteration +2/ +2" "$good"

p=$(copy bad_magic); printf 'XXXX' | dd of="$p.idx" bs=1 seek=0 conv=notrunc status=none
check fail "'$p.idx' does not start with the Megatron index magic" "$p"

p=$(copy bad_dtype); printf '\x63' | dd of="$p.idx" bs=1 seek=17 conv=notrunc status=none
check fail "'$p.idx'.*dtype code 99" "$p"

p=$(copy short_idx); truncate -s 100 "$p.idx"
check fail "'$p.idx'.*(truncated|too short|holds)" "$p"

p=$(copy short_bin); truncate -s 50 "$p.bin"
check fail "'$p.bin'.*(shorter|truncated|holds)" "$p"

p=$(copy no_bin); rm "$p.bin"
check fail "cannot open '$p.bin'" "$p"

check fail "cannot open '$tmp/nothing.idx'" "$tmp/nothing"
echo "corrupt_data: every damaged dataset is a clear error naming the file"
