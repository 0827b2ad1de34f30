#!/usr/bin/env bash
# The planner's time model (engine/plan/step_time.h) against speeds bench/RESULTS.md records,
# configuration by configuration: the dry run's estimate beside the recorded figure. Runs on
# any machine (no GPU): bash bench/planner/recorded.sh build/megaengine
# Recorded rows (the RESULTS.md section each comes from):
#   H100, 1 GPU, micro 4, seq 2048 (fourteenth session, call 8): GPT 1.3B 59,752 tokens/s,
#     LLaMA 1B 70,861 tokens/s
#   H200, tp 2 + SP, GPT 1.3B, micro 4, 2 GPUs (ninth session, call 7, default): 97,979 tokens/s
#   H200, 4 GPUs, #35's table (global 8, micro 1): the marginal time of a layer (layers 2 and 4),
#     GPT-39B width tp 1 132.0 ms, tp 4 + SP 44.4 ms; LLaMA-2-70B width tp 1 283.8, tp 4 + SP 85.2
set -euo pipefail
bin=${1:-build/megaengine}
here=$(cd "$(dirname "$0")" && pwd)
est() {  # model world gpu overrides... -> estimated seconds per step
  local model=$1 world=$2 gpu=$3
  shift 3
  ME_PLAN_MODEL=$model "$bin" --dry-run "$here/recorded.lua" --world "$world" --gpu "$gpu" "$@" 2>&1 |
    sed -n 's/^estimated step time on [^:]*: \([0-9.]*\) s.*/\1/p'
}
row() {  # label recorded predicted unit
  awk -v l="$1" -v r="$2" -v p="$3" -v u="$4" 'BEGIN { printf "| %s | %s %s | %.1f %s | %+.1f%% |\n", l, r, u, p, u, 100 * (p / r - 1) }'
}
tokens() { awk -v s="$1" -v t="$2" 'BEGIN { print t / s }'; }
marginal() {  # model world gpu overrides... -> ms per layer per step (layers 2 and 4)
  local a b
  a=$(est "$@" batch.micro=1 batch.global=8 model.layers=2)
  b=$(est "$@" batch.micro=1 batch.global=8 model.layers=4)
  awk -v a="$a" -v b="$b" 'BEGIN { print (b - a) / 2 * 1000 }'
}
echo "| configuration | recorded | estimated | error |"
echo "|---|--:|--:|--:|"
row "GPT 1.3B, 1 x H100, micro 4" 59752 "$(tokens "$(est gpt1.3b 1 h100-80gb)" 8192)" tokens/s
row "LLaMA 1B, 1 x H100, micro 4" 70861 "$(tokens "$(est llama1b 1 h100-80gb)" 8192)" tokens/s
row "GPT 1.3B, 2 x H200 tp 2 + SP, micro 4" 97979 "$(tokens "$(est gpt1.3b 2 h200-141gb parallel.tp=2 parallel.sequence_parallel=true)" 8192)" tokens/s
row "GPT-39B width, H200, layer at tp 1" 132.0 "$(marginal gpt39b-width 1 h200-141gb)" ms
row "GPT-39B width, 4 x H200, layer at tp 4 + SP" 44.4 "$(marginal gpt39b-width 4 h200-141gb parallel.tp=4 parallel.sequence_parallel=true)" ms
row "LLaMA-2-70B width, H200, layer at tp 1" 283.8 "$(marginal llama70b-width 1 h200-141gb)" ms
row "LLaMA-2-70B width, 4 x H200, layer at tp 4 + SP" 85.2 "$(marginal llama70b-width 4 h200-141gb parallel.tp=4 parallel.sequence_parallel=true)" ms
