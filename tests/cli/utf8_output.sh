#!/usr/bin/env bash
# utf8_output.sh MEGAENGINE [overrides...]: the default recipe (recipes/gpt_tiny.lua, GPT-2 BPE)
# run briefly, with a sample long and random enough that a barely trained model emits tokens
# that split characters; everything it prints must be valid UTF-8 (decoded strictly), and the
# preprocess line must read as people write numbers ("in 0.10 s (12.1 MB/s)").
# The assets are copied into a temporary directory, so the preprocessed .bin/.idx land there
# and never race with other tests on assets/.
set -u
bin=$1
shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
assets=${ME_ASSET_DIR:-$repo/assets}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in moby-dick.txt gpt2-encoder.json gpt2-vocab.bpe; do
  cp "$assets/$f" "$tmp/" || { echo "FAILED: asset $f missing (run scripts/fetch_assets.sh)"; exit 1; }
done
cd "$repo"
ME_ASSET_DIR=$tmp timeout 240 "$bin" recipes/gpt_tiny.lua train.iters=4 train.log_interval=2 train.eval_interval=0 \
  train.eval_iters=1 schedule.warmup_iters=1 sample.tokens=300 sample.top_k=50257 sample.temperature=3.0 "$@" \
  >"$tmp/out.txt" 2>&1
rc=$?
fail() { echo "FAILED: $1"; echo "--- output:"; cat -v "$tmp/out.txt"; exit 1; }
[ $rc -eq 0 ] || fail "exit status $rc"
grep -q "sample (300 tokens" "$tmp/out.txt" || fail "no sample in the output"
python3 - "$tmp/out.txt" <<'PY' || fail "the output is not valid UTF-8"
import sys
data = open(sys.argv[1], "rb").read()
try:
    data.decode("utf-8", errors="strict")
except UnicodeDecodeError as e:
    print(f"invalid UTF-8 at byte {e.start}: {data[max(0, e.start - 20):e.end + 20]!r}")
    sys.exit(1)
PY
line=$(grep "preprocessed " "$tmp/out.txt") || fail "no preprocess line"
echo "$line" | grep -Eq 'tokens in [0-9.]+ (s|ms|us|min [0-9]+ s) \([0-9.]+ MB/s\)$' || fail "preprocess line not in the expected form: $line"
echo "$line" | grep -Eq '[0-9]\.[0-9]{3,}' && fail "preprocess line has unrounded numbers: $line"
echo "utf8_output: the default run's output is valid UTF-8; $line"
