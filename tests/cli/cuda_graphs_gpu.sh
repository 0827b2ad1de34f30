#!/usr/bin/env bash
# On a GPU (skipped without one, exit 77; with 2 and 4 GPUs also tp and dp): train.cuda_graphs
# (model/block_graphs.h) against the same run without it. The graphs replay the kernels the
# eager step queues, so the fp32 runs follow the eager losses within 1e-5 (relative, every logged
# loss; the main grads are zeroed and added to instead of written, and the copy engines meet at
# barriers instead of signals: the same sums), bf16 within 2e-2. The log says what was captured.
#   bash tests/cli/cuda_graphs_gpu.sh build/megaengine
set -uo pipefail
bin=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 1 ]; then echo "needs a GPU: skipped"; exit 77; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(device=cuda precision=fp32 model.layers=4 model.hidden=256 model.heads=8 batch.micro=4 batch.global=32
        train.iters=30 train.log_interval=5 train.eval_iters=0 sample.tokens=0)
loss_tol=1e-5
source "$repo/tests/cli/loss_runs.sh"  # train, follows
# captured NAME: the log names the blocks captured (4 layers: 4 of each)
captured() {
  grep -q "CUDA graphs (train.cuda_graphs): 4 blocks: 4 forwards and 4 backwards captured" "$tmp/$1.log" ||
    { echo "FAILED: $1 logged no capture"; grep -i "graph" "$tmp/$1.log" | head; exit 1; }
}
# pair NAME NPROC TOL OVERRIDES...: eager and graphed runs of the same layout
pair() {
  local name=$1 nproc=$2 tol=$3
  shift 3
  train "${name}_eager" "$nproc" "$@"
  train "${name}_graphs" "$nproc" "$@" train.cuda_graphs=true
  captured "${name}_graphs"
  follows "${name}_eager" "${name}_graphs" "$name, graphs against eager: " "$tol"
}
pair one_gpu 1 1e-5
pair one_gpu_bf16 1 2e-2 precision=bf16
pair llama_bf16 1 2e-2 precision=bf16 model.norm=rmsnorm model.activation=swiglu model.position=rope \
  model.bias=false model.tie_embeddings=false model.query_groups=4 model.recompute=selective
if [ "$gpus" -ge 2 ]; then
  pair tp2 2 1e-5 parallel.tp=2 parallel.sequence_parallel=true parallel.tp_comm_backend=copy_engine
  pair dp2 2 1e-5
  # NCCL's tensor-parallel collectives are not captured: refused before the first step
  "$bin" --nproc 2 "$repo/recipes/gpt_tiny.lua" "${common[@]}" parallel.tp=2 parallel.sequence_parallel=true \
    parallel.tp_comm_backend=nccl train.cuda_graphs=true > "$tmp/refused.log" 2>&1 &&
    { echo "FAILED: tp 2 on NCCL with graphs was not refused"; exit 1; }
  grep -q "train.cuda_graphs = true: parallel.tp = 2 needs the copy engines" "$tmp/refused.log" ||
    { echo "FAILED: the refusal does not name the fields"; tail -5 "$tmp/refused.log"; exit 1; }
  echo "tp 2 on NCCL with graphs: refused, naming the fields"
fi
if [ "$gpus" -ge 4 ]; then
  pair tp4 4 1e-5 parallel.tp=4 parallel.sequence_parallel=true parallel.tp_comm_backend=copy_engine
  pair tp2dp2 4 1e-5 parallel.tp=2 parallel.sequence_parallel=true parallel.tp_comm_backend=copy_engine
fi
for run in one_gpu tp2 tp4; do
  [ -f "$tmp/${run}_graphs.log" ] || continue
  echo "$run eager:  $(grep -h "tokens/s" "$tmp/${run}_eager.log" | tail -1)"
  echo "$run graphs: $(grep -h "tokens/s" "$tmp/${run}_graphs.log" | tail -1)"
done
echo "cuda graphs: all runs follow their eager twins"
