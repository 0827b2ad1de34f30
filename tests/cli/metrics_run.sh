#!/usr/bin/env bash
# log.dir end to end: a short CPU run writes TensorBoard events and metrics.jsonl; the event
# file is read back by the independent reader (every record's CRCs checked), and each progress
# line's lm loss, learning rate, grad norm and consumed samples, and the validation loss, must
# equal the event file's value at that iteration (within the digits printed). The recipe is
# there as a text summary at step 0, and metrics.jsonl holds the same records.
set -euo pipefail
bin=$1 dump=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the assets copied, so the preprocessed .bin/.idx land in $tmp and never race with
# lua.train_loss's on assets/ (a fresh clone has none; CTest may run both at once)
assets=${ME_ASSET_DIR:-assets}
for f in moby-dick.txt gpt2-encoder.json gpt2-vocab.bpe; do
  cp "$assets/$f" "$tmp/" || { echo "FAILED: asset $f missing (run scripts/fetch_assets.sh)"; exit 1; }
done
ME_ASSET_DIR=$tmp "$bin" recipes/gpt_tiny.lua train.iters=12 train.log_interval=4 train.eval_interval=8 train.eval_iters=1 \
  schedule.warmup_iters=2 sample.tokens=0 log.dir="$tmp/logs" > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt"; exit 1; }
events=("$tmp"/logs/tensorboard/events.out.tfevents.*)
[ -f "${events[0]}" ] || { echo "FAILED: no event file under $tmp/logs/tensorboard"; exit 1; }
"$dump" "${events[0]}" > "$tmp/events.tsv"
/usr/bin/env python3 - "$tmp/out.txt" "$tmp/events.tsv" "$tmp/logs/metrics.jsonl" <<'PY'
import json, re, sys
out, tsv, jsonl = sys.argv[1:4]
tb = {}
for line in open(tsv):
    step, tag, value = line.rstrip("\n").split("\t")
    tb[(int(step), tag)] = value
fields = {"lm loss": "lm loss", "learning rate": "learning-rate", "grad norm": "grad-norm",
          "consumed samples": "consumed-samples"}
checked = 0
def close(printed, logged):
    digits = printed.split("E")[0].split(".")[1] if "." in printed else ""
    exp = int(printed.split("E")[1]) if "E" in printed else 0
    tol = 0.5 * 10 ** (exp - len(digits)) + 1e-6 * abs(float(printed))  # + float32 rounding
    return abs(float(printed) - float(logged)) <= tol
for line in open(out):
    m = re.search(r"iteration +(\d+)/ *\d+ \|(.*)", line) or re.search(r"validation loss at iteration (\d+) \|(.*)", line)
    if not m: continue
    step, rest = int(m.group(1)), m.group(2)
    val = "validation" in line
    for part in rest.split("|"):
        if ":" not in part: continue
        name, printed = (s.strip() for s in part.split(":", 1))
        tag = ("lm loss validation" if name == "lm loss" else None) if val else fields.get(name)
        if tag is None: continue
        logged = tb.get((step, tag))
        if logged is None or not close(printed, logged):
            sys.exit(f"FAILED: iteration {step} '{name}' printed {printed}, event file has {logged}")
        checked += 1
if not any(tag == "recipe" and v.startswith("text:text:") for (s, tag), v in tb.items() if s == 0):
    sys.exit("FAILED: no recipe text summary at step 0")
records = [json.loads(l) for l in open(jsonl)]
for r in records:
    if r["kind"] == "train" and abs(r["lm_loss"] - float(tb[(r["step"], "lm loss")])) > 1e-6 * abs(r["lm_loss"]):
        sys.exit(f"FAILED: metrics.jsonl step {r['step']} lm_loss {r['lm_loss']} vs event file")
kinds = [r["kind"] for r in records]
if kinds.count("train") != 3 or kinds.count("eval") < 1:
    sys.exit(f"FAILED: metrics.jsonl records {kinds}, expected 3 train and an eval")
print(f"metrics_run: {checked} printed values equal the event file's; {len(records)} jsonl records")
PY
