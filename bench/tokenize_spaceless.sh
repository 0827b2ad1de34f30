#!/usr/bin/env bash
# GPT-2 tokenizing's worst case (issue 38, item 21): documents that are one long run of letters
# with no spaces, so the pre-tokenizer leaves a single piece of the whole document and every
# merge works on it. Before the heap-based merges (engine/data/gpt2_tokenizer.cpp, bpe_long) a
# 1 MB run took ~48 s (O(n) per distinct merge); now it should grow as n log n. Prints the time
# of `megaengine preprocess` for runs of 0.25, 0.5, 1 and 2 MB (each doubling should about
# double the time).
#   bench/tokenize_spaceless.sh [BUILD_DIR]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
assets=${ME_ASSET_DIR:-$repo/assets}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for kb in 250 500 1000 2000; do
  python3 - "$assets/moby-dick.txt" "$kb" > "$tmp/in.jsonl" <<'PY'
import json, sys
letters = "".join(c for c in open(sys.argv[1], encoding="utf-8").read() if c.isascii() and c.isalpha())
n = int(sys.argv[2]) * 1000
print(json.dumps({"text": (letters * (n // len(letters) + 1))[:n]}))
PY
  start=$(date +%s.%N)
  "$build/megaengine" preprocess --input "$tmp/in.jsonl" --output-prefix "$tmp/out" --tokenizer gpt2 --no-progress > /dev/null
  end=$(date +%s.%N)
  printf '%5d KB without a space: %6.2f s\n' "$kb" "$(echo "$end - $start" | bc)"
done
