#!/usr/bin/env bash
# The GPU checks that compare megaengine with independent references, in one device call
# (after `source .debs/device-env.sh`; the build at $ME_BENCH_BUILD, default /tmp/b):
#   bash bench/device_checks.sh OUT_DIR
# - memory: bench/memory_check.sh, the dry run's predicted peak against the measured one;
# - hf: bench/reference/hf_check.sh, export/import against transformers;
# - tensorboard: a short bf16 run with log.dir, read back by TensorBoard's EventAccumulator
#   (bench/reference/check_tensorboard.py) against the progress lines and metrics.jsonl;
# - oov: a token id outside the vocabulary, on the GPU (tests/cli/oov_data.sh device=cuda).
# Each part's output is OUT_DIR/<part>.txt; the last lines of each are printed.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$1 build=${ME_BENCH_BUILD:-/tmp/b}
bin=$build/megaengine
mkdir -p "$out"
cd "$repo"
part() {  # part NAME COMMAND...: runs it, keeps its output, prints its tail and status
  local name=$1
  shift
  local t0=$SECONDS
  "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - t0)) s"
  tail -n "${ME_TAIL:-14}" "$out/$name.txt" | cut -c1-220
}
tensorboard_run() {
  local dir=/tmp/me_tb
  rm -rf "$dir"
  "$bin" recipes/gpt_tiny.lua device=cuda precision=bf16 train.iters=40 train.log_interval=10 \
    train.eval_interval=20 train.eval_iters=2 sample.tokens=0 log.dir="$dir/logs" > "$dir.out" 2>&1 || { cat "$dir.out"; return 1; }
  grep -E "iteration|validation" "$dir.out" | tail -3
  python3 bench/reference/check_tensorboard.py "$dir/logs" --progress "$dir.out"
}
for p in ${ME_CHECKS:-memory hf tensorboard oov}; do
  case $p in
    memory) part memory bash bench/memory_check.sh "$bin" ;;
    hf) part hf bash bench/reference/hf_check.sh "$bin" /tmp/hf_check ;;
    tensorboard) part tensorboard tensorboard_run ;;
    oov) part oov bash tests/cli/oov_data.sh "$bin" device=cuda ;;
  esac
done
