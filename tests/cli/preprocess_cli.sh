#!/usr/bin/env bash
# `megaengine preprocess` as a batch job meets it: exit 0 on success, 1 on bad data (naming the
# file and line, writing nothing), 2 on bad usage; --skip-bad-records goes on with a warning.
#   preprocess_cli.sh MEGAENGINE
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
expect() { bash "$here/expect.sh" "$@"; }

printf '{"text": "one"}\n{"text": "two"}\n{"text": "three\n{"text": "four"}\n' > "$tmp/bad.jsonl"
expect fail "$tmp/bad.jsonl:3: malformed JSON.*--skip-bad-records" -- \
  "$bin" preprocess --input "$tmp/bad.jsonl" --output-prefix "$tmp/out" --tokenizer gpt2 --workers 2
if ls "$tmp"/out* >/dev/null 2>&1; then echo "FAILED: a failed run left files: $(ls "$tmp")"; exit 1; fi
expect ok "skipping $tmp/bad.jsonl:3: malformed JSON.*3 documents, [0-9]+ tokens, 1 skipped" -- \
  "$bin" preprocess --input "$tmp/bad.jsonl" --output-prefix "$tmp/out" --tokenizer gpt2 --skip-bad-records
[ -s "$tmp/out_text_document.bin" ] && [ -s "$tmp/out_text_document.idx" ] || { echo "FAILED: no output"; exit 1; }

# Megatron's flag spellings work too.
expect ok "3 documents, 6 tokens, 1 skipped" -- "$bin" preprocess --input "$tmp/bad.jsonl" --output-prefix "$tmp/m" \
  --tokenizer-type GPT2BPETokenizer --json-keys text --append-eod --skip-bad-records --workers 2 --no-progress
expect fail "cannot open input '$tmp/none.jsonl'" -- "$bin" preprocess --input "$tmp/none.jsonl" --output-prefix "$tmp/x" --tokenizer gpt2
expect fail "unknown tokenizer.kind 'bert'; valid kinds: gpt2, sentencepiece" -- "$bin" preprocess --input "$tmp/bad.jsonl" --output-prefix "$tmp/x" --tokenizer bert
expect fail "cannot open SentencePiece model '$tmp/none.model'" -- "$bin" preprocess --input "$tmp/bad.jsonl" --output-prefix "$tmp/x" --tokenizer sentencepiece --tokenizer-model "$tmp/none.model"

set +e
"$bin" preprocess --input "$tmp/bad.jsonl" > "$tmp/usage.log" 2>&1; rc=$?
set -e
[ $rc -eq 2 ] && grep -q -- "--output-prefix is required" "$tmp/usage.log" || { echo "FAILED: bad usage gave exit $rc: $(cat "$tmp/usage.log")"; exit 1; }
expect ok "usage: megaengine preprocess" -- "$bin" preprocess --help
echo "preprocess_cli: all checks passed"
