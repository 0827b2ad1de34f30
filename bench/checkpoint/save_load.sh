#!/usr/bin/env bash
# Checkpoints of GPT 1.3B in bf16 on one GPU: the pause of an asynchronous save (the copy to
# pinned host memory), the write throughput to local disk, the step time while a save is being
# written against the steps without one, and the time to load it back.
#   bash bench/checkpoint/save_load.sh BUILD OUT_DIR [CKPT_DIR (default /tmp/me_ckpt_bench)]
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$1 out=$2 ckpt=${3:-/tmp/me_ckpt_bench}
mkdir -p "$out"
rm -rf "$ckpt"
row=$repo/bench/speed/megaengine_row.lua
common="train.log_interval=1 checkpoint.dir=$ckpt"
# 150 steps, a save at 60 (written while steps 61.. run) and one at the end (150).
ME_BENCH_MODEL=gpt1.3b ME_BENCH_WARMUP=10 ME_BENCH_STEPS=140 ME_BENCH_OVERRIDES="$common checkpoint.interval=60" \
  "$build/megaengine" "$row" > "$out/save.log" 2>&1 || { tail -20 "$out/save.log"; exit 1; }
# The same run without checkpoints: the step time a save must not slow.
ME_BENCH_MODEL=gpt1.3b ME_BENCH_WARMUP=10 ME_BENCH_STEPS=140 ME_BENCH_OVERRIDES="train.log_interval=1" \
  "$build/megaengine" "$row" > "$out/plain.log" 2>&1 || { tail -20 "$out/plain.log"; exit 1; }
# Loading it back: a new process resumes at iteration 150 and trains 1 more step.
ME_BENCH_MODEL=gpt1.3b ME_BENCH_WARMUP=150 ME_BENCH_STEPS=1 ME_BENCH_OVERRIDES="$common checkpoint.save_on_exit=false" \
  "$build/megaengine" "$row" > "$out/load.log" 2>&1 || { tail -20 "$out/load.log"; exit 1; }
du -sh "$ckpt"/iter_0000150 > "$out/size.txt"
python3 - "$out" <<'PY'
import re, sys
out = sys.argv[1]
def steps(path):
    ms = {}
    for line in open(path):
        m = re.search(r"iteration +(\d+)/ +\d+ \| .*elapsed time per iteration \(ms\): ([0-9.]+)", line)
        if m: ms[int(m.group(1))] = float(m.group(2))
    return ms
save, plain = steps(out + "/save.log"), steps(out + "/plain.log")
pauses, writes, inflight = [], [], set()
for line in open(out + "/save.log"):
    m = re.search(r"saved checkpoint iteration (\d+) .*: ([0-9.e+-]+) GB in .* pause ([0-9.e+-]+) ms; written in ([0-9.e+-]+) s .*, ([0-9.e+-]+) GB/s over all shards; committed ([0-9.e+-]+) s", line)
    if not m: continue
    it, gb, pause, secs, gbs, committed = int(m[1]), float(m[2]), float(m[3]), float(m[4]), float(m[5]), float(m[6])
    pauses.append(pause); writes.append((gb, secs, gbs))
    t, k = 0.0, it + 1          # the steps that ran while this save was being written
    while k in save and t < committed * 1000:
        inflight.add(k); t += save[k]; k += 1
load = [l for l in open(out + "/load.log") if "resumed from" in l]
timed = [k for k in save if k > 10]
with_save = [save[k] for k in timed if k in inflight]
without = [save[k] for k in timed if k not in inflight]
base = [plain[k] for k in plain if k > 10]
mean = lambda v: sum(v) / len(v) if v else float("nan")
print("GPT 1.3B bf16, one GPU: checkpoint of %.2f GB (model bf16 + fp32 masters + Adam moments)" % writes[0][0])
print("  pause (copy to pinned host memory, allocated ahead): %s ms" % ", ".join("%.0f" % p for p in pauses))
print("  write to local disk: %s" % ", ".join("%.1f s at %.2f GB/s" % (s, g) for _, s, g in writes))
print("  step time: %.1f ms with a save being written (%d steps), %.1f ms without (%d steps); %.1f ms in the run without checkpoints"
      % (mean(with_save), len(with_save), mean(without), len(without), mean(base)))
print("  overhead of a save in flight: %+.1f%% per step" % (100 * (mean(with_save) / mean(without) - 1)))
print("  load: " + (re.sub(r".*\); ", "", load[0]).strip() if load else "no resume line"))
PY
