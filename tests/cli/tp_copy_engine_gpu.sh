#!/usr/bin/env bash
# On 2 GPUs (skipped without them, exit 77; with 4 also tp 4, below): tensor parallelism 2 with sequence parallelism,
# its overlapped all-gathers and reduce-scatters on the copy engines (parallel.tp_comm_backend =
# "copy_engine", kernels/peer_buffers.h) against NCCL's: the same run in fp32 follows the same
# loss curve (every logged loss within 1e-4 relative: the sums are taken in another order) and
# the training is not slower by more than noise is reported, not checked. The default,
# tp_comm_backend = "auto", takes the copy engines here and gives their losses.
#   bash tests/cli/tp_copy_engine_gpu.sh build/megaengine
set -uo pipefail
bin=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 2 ]; then echo "needs 2 GPUs: skipped"; exit 77; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(device=cuda precision=fp32 model.layers=4 model.hidden=256 model.heads=8 batch.micro=8 train.iters=30
        train.log_interval=5 train.eval_iters=0 sample.tokens=0 parallel.tp=2 parallel.sequence_parallel=true)
loss_tol=1e-4
source "$repo/tests/cli/loss_runs.sh"  # train, follows
# auto (the default) must resolve to the copy engines here, and say so
for backend in nccl copy_engine auto; do train "$backend" 2 parallel.tp_comm_backend=$backend; done
grep -q 'tensor-parallel collectives on the copy engines (parallel.tp_comm_backend = "auto")' "$tmp/auto.log" ||
  { echo "FAILED: tp_comm_backend = auto did not take the copy engines"; grep -i 'copy engine\|peer' "$tmp/auto.log"; exit 1; }
paste "$tmp/copy_engine.loss" "$tmp/auto.loss" | awk '{ d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > 1e-6) bad = 1; n++ }
  END { exit bad || n < 6 }' ||
  { echo "FAILED: auto's losses differ from copy_engine's"; paste "$tmp/copy_engine.loss" "$tmp/auto.loss"; exit 1; }
[ -s "$tmp/nccl.loss" ] || { echo "FAILED: no loss logged"; tail -20 "$tmp/nccl.log"; exit 1; }
follows nccl copy_engine ""
# the default: the reduce-scatters wait for each peer's arrival signal and the all-gathers' pulls for
# each peer's publication signal; with ME_TP_RS_SIGNALS=0 / ME_TP_AG_SIGNALS=0, a barrier of all
# ranks instead: the same sums in the same order, so the same losses; a signal ahead of its data
# shows as a wrong loss
ME_TP_RS_SIGNALS=0 train copy_engine_rs_barrier 2 parallel.tp_comm_backend=copy_engine
follows copy_engine_rs_barrier copy_engine "signals against ME_TP_RS_SIGNALS=0: " 1e-6
ME_TP_RS_SIGNALS=0 ME_TP_AG_SIGNALS=0 train copy_engine_barriers 2 parallel.tp_comm_backend=copy_engine
follows copy_engine_barriers copy_engine "signals against both barriers: " 1e-6
# the held weight-gradient GEMMs on a stream of their own with 16 SMs left free (ME_TP_WGRAD_STREAM):
# the same GEMMs into the same main grads in the same order (cuBLAS may pick other kernels for
# fewer SMs); a missed wait between the streams shows as a wrong gradient
ME_TP_WGRAD_STREAM=16 train copy_engine_wgrad_stream 2 parallel.tp_comm_backend=copy_engine
follows copy_engine copy_engine_wgrad_stream "with ME_TP_WGRAD_STREAM=16: "
# bf16, where the chunks' GEMMs go through cuBLASLt (ME_KERNELS' chunk_gemm): the same run with
# LibTorch's mm instead follows it within 2e-2 (bf16 rounding of two GEMM algorithms over 30 steps)
train bf16_chunk_gemm 2 parallel.tp_comm_backend=copy_engine precision=bf16
ME_KERNELS=swiglu,rotary,cross_entropy,adamw,linear_bias,add_norm,gemm_gelu \
  train bf16_no_chunk_gemm 2 parallel.tp_comm_backend=copy_engine precision=bf16
follows bf16_no_chunk_gemm bf16_chunk_gemm "bf16, chunk_gemm against LibTorch's mm: " 2e-2
grep -h "tokens/s" "$tmp/nccl.log" | tail -1 | sed 's/^/nccl:        /'
grep -h "tokens/s" "$tmp/copy_engine.log" | tail -1 | sed 's/^/copy_engine: /'
# With 4 GPUs also tp 4, where each rank pulls from three peers one after another and pushes to
# them on three copy streams: it follows NCCL's losses too, and so does the copy engines' path
# without the delayed weight gradients (parallel.tp_delay_wgrad = false: all-gathers beside the
# input-gradient GEMM split per rank's rows).
if [ "$gpus" -ge 4 ]; then
  for backend in nccl copy_engine; do train "tp4_$backend" 4 parallel.tp=4 parallel.tp_comm_backend=$backend; done
  train tp4_copy_engine_nodelay 4 parallel.tp=4 parallel.tp_comm_backend=copy_engine parallel.tp_delay_wgrad=false
  follows tp4_nccl tp4_copy_engine "tp 4: "
  follows tp4_copy_engine tp4_copy_engine_nodelay "tp 4 without tp_delay_wgrad: "
  # and with the peers' rows of the all-gathers' GEMMs grouped (ME_TP_GATHER_GROUP: up to 3 at once)
  ME_TP_GATHER_GROUP=3 train tp4_copy_engine_grouped 4 parallel.tp=4 parallel.tp_comm_backend=copy_engine
  follows tp4_copy_engine tp4_copy_engine_grouped "tp 4 with ME_TP_GATHER_GROUP=3: "
  ME_TP_RS_SIGNALS=0 ME_TP_AG_SIGNALS=0 train tp4_copy_engine_barriers 4 parallel.tp=4 parallel.tp_comm_backend=copy_engine
  follows tp4_copy_engine_barriers tp4_copy_engine "tp 4, signals against both barriers: " 1e-6
  ME_TP_AG_SIGNALS=0 train tp4_copy_engine_ag_barrier 4 parallel.tp=4 parallel.tp_comm_backend=copy_engine
  follows tp4_copy_engine_barriers tp4_copy_engine_ag_barrier "tp 4, ME_TP_AG_SIGNALS=0: " 1e-6
  ME_TP_WGRAD_STREAM=16 train tp4_copy_engine_wgrad_stream 4 parallel.tp=4 parallel.tp_comm_backend=copy_engine
  follows tp4_copy_engine tp4_copy_engine_wgrad_stream "tp 4 with ME_TP_WGRAD_STREAM=16: "
  # tp 2 x dp 2: the data-parallel buckets' reductions wait for that stream too (fence)
  train tp2dp2 4 parallel.tp_comm_backend=copy_engine
  ME_TP_WGRAD_STREAM=16 train tp2dp2_wgrad_stream 4 parallel.tp_comm_backend=copy_engine
  follows tp2dp2 tp2dp2_wgrad_stream "tp 2 x dp 2 with ME_TP_WGRAD_STREAM=16: "
  # the recipe field (no SMs held back) under the pipeline's own deferred weight gradients (4
  # micro-batches a step)
  train tp2pp2 4 parallel.tp_comm_backend=copy_engine parallel.pp=2 batch.micro=2
  train tp2pp2_wgrad_stream 4 parallel.tp_comm_backend=copy_engine parallel.pp=2 batch.micro=2 parallel.tp_wgrad_stream=true
  follows tp2pp2 tp2pp2_wgrad_stream "tp 2 x pp 2 with parallel.tp_wgrad_stream: "
fi
echo "tp_copy_engine_gpu: passed"
