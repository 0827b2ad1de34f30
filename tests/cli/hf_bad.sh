#!/usr/bin/env bash
# Bad Hugging Face input through the CLI: each is one clear message naming the file and the
# tensor (or the fields), a non-zero exit, nothing written. A tiny LLaMA is trained 2 steps and
# exported; copies of the export are then damaged: a tensor missing, offsets past the end of
# the file, a dtype we cannot read, integer weights; and a recipe whose model differs from
# config.json loads it with checkpoint.load = "hf:DIR". Usage: hf_bad.sh MEGAENGINE
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python=/usr/bin/python3
[ -x "$python" ] || python=python3
script=$here/lua/train_parallel.lua
failures=0

ME_EQUIV_MODEL=llama timeout 300 "$bin" "$script" train.iters=2 schedule.warmup_iters=1 checkpoint.dir="$tmp/ckpt" \
  > "$tmp/train.log" 2>&1 || { tail -20 "$tmp/train.log"; exit 1; }
"$bin" export "$tmp/ckpt" --format hf --out "$tmp/hf" > "$tmp/export.log" 2>&1 || { cat "$tmp/export.log"; exit 1; }

damaged() {  # name python-edit: a copy of the export whose model.safetensors header is edited
  local dir=$tmp/$1
  cp -r "$tmp/hf" "$dir"
  "$python" - "$dir/model.safetensors" "$2" <<'PY'
import json, struct, sys
path, edit = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
(n,) = struct.unpack("<Q", data[:8])
h, body = json.loads(data[8:8 + n]), data[8 + n:]
t = "model.layers.1.mlp.up_proj.weight"
exec(edit)
text = json.dumps(h).encode()
open(path, "wb").write(struct.pack("<Q", len(text)) + text + body)
PY
}

expect_fail() {  # name regex command...
  local name=$1 regex=$2
  shift 2
  local out rc=0
  out=$(timeout 120 "$@" 2>&1) || rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 124 ] || ! printf '%s' "$out" | tr '\n' ' ' | grep -Eq -- "$regex" ||
     printf '%s' "$out" | grep -Eq 'terminate called|Exception raised from|Segmentation fault'; then
    echo "FAILED: $name (exit $rc), expected /$regex/:"
    printf '%s\n' "$out" | tail -8
    failures=$((failures + 1))
    return
  fi
  echo "ok: $name: $(printf '%s' "$out" | grep -E "megaengine: |error" | head -1 | cut -c1-300)"
}

t='model.layers.1.mlp.up_proj.weight'
damaged missing 'del h[t]'
expect_fail "missing tensor" "has no tensor '$t' \(megaengine's blocks.1.mlp.gate_up.weight\)" \
  "$bin" import "$tmp/missing" --out "$tmp/out_missing"
damaged past_end 'h[t]["data_offsets"][1] = len(body) + 8'
expect_fail "offsets past the end" "'$tmp/past_end/model.safetensors': tensor '$t': its bytes \[.*lie past the end of the file" \
  "$bin" import "$tmp/past_end" --out "$tmp/out_past_end"
damaged fp8 'h[t]["dtype"] = "F8_E4M3"'
expect_fail "unknown dtype" "'$tmp/fp8/model.safetensors': tensor '$t': dtype 'F8_E4M3' cannot be read" \
  "$bin" import "$tmp/fp8" --out "$tmp/out_fp8"
damaged int32 'h[t]["dtype"] = "I32"'
expect_fail "integer weights" "'$tmp/int32/model.safetensors': tensor '$t' is I32; only F32, BF16, F16 and F64 weights" \
  "$bin" import "$tmp/int32" --out "$tmp/out_int32"
expect_fail "config does not match the recipe" \
  "does not match the recipe's model: +model.hidden: 96 in the recipe, 64 in config.json \(hidden_size\) +model.query_groups: 4 in the recipe, 2 in config.json \(num_key_value_heads\).*model.rope_base: 20000 in the recipe, 10000 in config.json \(rope_theta\)" \
  env ME_EQUIV_MODEL=llama "$bin" "$script" train.iters=2 schedule.warmup_iters=1 model.hidden=96 model.query_groups=4 model.rope_base=20000 \
  checkpoint.load="hf:$tmp/hf"
if [ "${ME_HF_NPROC:-0}" = 1 ]; then  # several ranks (Gloo): rank 0's failed conversion stops them all, none hangs
  expect_fail "missing tensor, 2 ranks" "has no tensor '$t' \(megaengine's blocks.1.mlp.gate_up.weight\)" \
    env ME_EQUIV_MODEL=llama "$bin" --nproc 2 "$script" train.iters=2 schedule.warmup_iters=1 comm.timeout_s=60 \
    checkpoint.dir="$tmp/run_missing" checkpoint.load="hf:$tmp/missing"
fi
expect_fail "not a model directory" "'$tmp/ckpt' has no config.json: it is not a Hugging Face model directory" \
  "$bin" import "$tmp/ckpt" --out "$tmp/out_ckpt"
for d in missing past_end fp8 int32 ckpt; do
  if [ -e "$tmp/out_$d" ] && [ -n "$(ls -A "$tmp/out_$d")" ]; then
    echo "FAILED: import of $d left files in $tmp/out_$d: $(ls -A "$tmp/out_$d")"
    failures=$((failures + 1))
  fi
done
[ $failures -eq 0 ] || { echo "hf_bad: $failures failed"; exit 1; }
echo "hf_bad: all refused"
