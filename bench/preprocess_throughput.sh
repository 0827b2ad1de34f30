#!/usr/bin/env bash
# `megaengine preprocess` throughput against the single-threaded baseline (bench/preprocess_baseline.cpp),
# measured in one run on the same input: a jsonl of Moby Dick's paragraphs, repeated COPIES times,
# each copy with its words' case changed differently so most words are new to the tokenizer's
# cache (as in a real corpus, where the cache mostly helps with frequent words).
#   bench/preprocess_throughput.sh [BUILD_DIR] [COPIES]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
copies=${2:-16}
assets=${ME_ASSET_DIR:-$repo/assets}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 - "$assets/moby-dick.txt" "$copies" > "$tmp/in.jsonl" <<'PY'
import json, sys, random
paras = [p for p in open(sys.argv[1], encoding="utf-8").read().split("\n\n") if p.strip()]
for c in range(int(sys.argv[2])):
    rng = random.Random(c)
    for p in paras:
        words = [w.upper() if rng.random() < 0.3 else (w.capitalize() if rng.random() < 0.3 else w) for w in p.split(" ")]
        print(json.dumps({"text": " ".join(words)}))
PY
echo "input: $(du -h "$tmp/in.jsonl" | cut -f1), $(wc -l < "$tmp/in.jsonl") documents; $(nproc) cores"
"$build/me_preprocess_baseline" "$tmp/in.jsonl" "$tmp/base" "$assets/gpt2-encoder.json" "$assets/gpt2-vocab.bpe"
for w in 1 2 4; do
  "$build/megaengine" preprocess --input "$tmp/in.jsonl" --output-prefix "$tmp/w$w" --tokenizer gpt2 \
    --append-eod --workers "$w" --no-progress
done
cmp "$tmp/base.bin" "$tmp/w1_text_document.bin" && cmp "$tmp/base.idx" "$tmp/w1_text_document.idx" &&
  echo "outputs: byte-identical to the baseline's"
