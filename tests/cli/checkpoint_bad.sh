#!/usr/bin/env bash
# A damaged checkpoint is a clear error naming the file (and the tensor where there is one),
# with a non-zero exit, and nothing written: a truncated shard, one flipped byte (checksum), a
# missing shard, a header whose offsets point past the end (its size and checksum forged to
# match, so the header check itself must catch it), a newer format version, a checkpoint of
# another model. Each case resumes from a copy of a good checkpoint; afterwards the copy's
# files are byte for byte what they were and nothing was added (megaengine.lock aside: each run
# writes its name into the lock it takes).
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
script=$here/lua/train_parallel.lua
good=$tmp/good
"$bin" "$script" checkpoint.dir="$good" train.exit_interval=2 > "$tmp/good.log" 2>&1 ||
  { echo "FAILED: could not make the checkpoint"; cat "$tmp/good.log"; exit 1; }
shard=iter_0000002/rank_00000.safetensors

# Python rewrites a shard's header and signs it again (size and CRC-32C in metadata.json).
forge_offsets() {  # dir
  python3 - "$1" <<'EOF'
import json, struct, sys
d = sys.argv[1]
path = d + "/iter_0000002/rank_00000.safetensors"
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
name = next(k for k in header if k != "__metadata__")
header[name]["data_offsets"][1] += 1 << 20          # past the end of the file
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
raw = struct.pack("<Q", len(text)) + text + raw[8 + n:]
open(path, "wb").write(raw)
table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    table.append(c)
crc = 0xFFFFFFFF
for b in raw:
    crc = (crc >> 8) ^ table[(crc ^ b) & 0xFF]
meta_path = d + "/iter_0000002/metadata.json"
meta = json.load(open(meta_path))
meta["shards"]["rank_00000.safetensors"].update(bytes=len(raw), crc32c="%08x" % (crc ^ 0xFFFFFFFF))
json.dump(meta, open(meta_path, "w"))
print(name)
EOF
}

status=0
case_() {  # name regex [overrides...]; the copy $tmp/name has been damaged already
  local name=$1 regex=$2
  shift 2
  local dir=$tmp/$name
  (cd "$dir" && find . -type f ! -name megaengine.lock -exec sha256sum {} + | sort > "$tmp/$name.before")
  local out rc=0
  out=$(timeout 120 "$bin" "$script" checkpoint.dir="$dir" "$@" 2>&1) || rc=$?
  (cd "$dir" && find . -type f ! -name megaengine.lock -exec sha256sum {} + | sort > "$tmp/$name.after")
  local flat
  flat=$(printf '%s' "$out" | tr '\n' ' ')
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
    echo "FAILED: $name: expected a clean non-zero exit, got $rc"; status=1
  elif ! printf '%s' "$flat" | grep -Eq -- "$regex"; then
    echo "FAILED: $name: output does not match /$regex/:"; printf '%s\n' "$out" | tail -5; status=1
  elif printf '%s' "$out" | grep -Eq 'terminate called|Exception raised from|Segmentation fault'; then
    echo "FAILED: $name: a crash or C++ exception dump"; status=1
  elif ! cmp -s "$tmp/$name.before" "$tmp/$name.after"; then
    echo "FAILED: $name: the checkpoint's files changed:"; diff "$tmp/$name.before" "$tmp/$name.after"; status=1
  else
    echo "ok $name: $(printf '%s' "$out" | grep -E -- "$regex" | head -1 | cut -c1-240)"
  fi
}

copy() { cp -r "$good" "$tmp/$1"; }

copy truncated
truncate -s -1000 "$tmp/truncated/$shard"
case_ truncated "checkpoint shard '.*rank_00000.safetensors' is [0-9]+ bytes but was written with [0-9]+ \(truncated"

copy flipped
size=$(stat -c %s "$tmp/flipped/$shard")
byte=$(dd if="$tmp/flipped/$shard" bs=1 skip=$((size / 2)) count=1 2>/dev/null | od -An -tu1 | tr -d ' ')
printf "$(printf '\\%03o' $(( (byte + 1) % 256 )))" | dd of="$tmp/flipped/$shard" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
case_ flipped "checkpoint shard '.*rank_00000.safetensors' fails its checksum \(CRC-32C [0-9a-f]+, written as [0-9a-f]+\)"

copy missing
rm "$tmp/missing/$shard"
case_ missing "shard 'rank_00000.safetensors' \(rank 0\) is missing"

copy offsets
tensor=$(forge_offsets "$tmp/offsets")
case_ offsets "rank_00000.safetensors': tensor '$tensor': its bytes \[[0-9]+, [0-9]+\) lie past the end of the file"

copy newer
sed -i 's/"version": 1,/"version": 99,/' "$tmp/newer/iter_0000002/metadata.json"
case_ newer "metadata.json' is checkpoint format version 99, newer than this megaengine reads \(1\)"

copy other_model
case_ other_model "holds a checkpoint of another model \(.*iter_0000002\): +model.hidden: 96 in the recipe, 64 in the checkpoint" model.hidden=96

# megaengine checkpoint inspect: the good one verifies, the flipped byte does not.
inspect=$("$bin" checkpoint inspect "$good" --verify 2>&1) || { echo "FAILED: inspect --verify of a good checkpoint: $inspect"; status=1; }
for want in "iteration 2, consumed samples 16" "saved at world 1 = tp 1 x pp 1 x dp 1" \
            "model.embedding.weight +F32 +\[256, 64\]" "exp_avg.blocks.1.mlp.fc2.weight" "verified: every shard"; do
  printf '%s' "$inspect" | grep -Eq -- "$want" || { echo "FAILED: inspect does not print /$want/:"; printf '%s\n' "$inspect" | head; status=1; }
done
if out=$("$bin" checkpoint inspect "$tmp/flipped" --verify 2>&1); then
  echo "FAILED: inspect --verify passed a flipped byte"; status=1
else
  printf '%s' "$out" | grep -q "fails its checksum" || { echo "FAILED: inspect --verify: $out"; status=1; }
fi
[ $status -eq 0 ] && echo "checkpoint_bad: every damaged checkpoint refused, nothing written; inspect --verify tells them apart"
exit $status
