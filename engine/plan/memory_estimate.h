// Per-GPU memory of a training run, from shapes alone (no LibTorch, nothing allocated): what
// `megaengine --dry-run` prints and what an out-of-memory error explains.
//
// It models what LibTorch's caching allocator holds at the step's peak on one GPU of a pipeline
// stage ("peak GPU memory ... allocated by tensors" at the end of a run): the parameters, the
// main-grad buffer, fp32 master weights and optimizer moments, the activations of the
// micro-batches in flight, and the transient of the backward pass at its heaviest point (the
// output layer's logits on the last stage, one layer's backward elsewhere). Activations follow
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models")
// where this engine saves what the paper assumes, and depart from it where it does not (see
// memory_estimate.cpp): no dropout, fused attention (no seq x seq scores), SwiGLU and GQA, and
// sequence parallelism that keeps the gathered inputs of column-parallel layers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/pipeline_stage.h"
#include "engine/model/transformer_config.h"

namespace me::plan {

// Everything the estimate depends on: the model, the layout and the step's batch.
struct MemoryPlan {
  model::TransformerConfig model;
  int world = 1, tp = 1, pp = 1;  // dp is what is left of the world
  bool sequence_parallel = false, distributed_optimizer = false;
  std::string pp_split = "even";  // even | balanced (model::balanced_stage_split)
  int64_t pp_first_layers = 0, pp_last_layers = 0;
  int64_t micro_batch = 1, global_batch = 0;  // global 0: micro x dp (no accumulation)
  std::string precision = "bf16";             // fp32 | bf16 | fp16 | fp8
  std::string grad_reduce_dtype = "fp32";     // the main-grad buffer's dtype: fp32 | bf16
  std::string optimizer = "adamw";            // adamw (two fp32 moments) | sgd (one)
  int64_t deferred_wgrads = 1;                // parallel.pp_deferred_wgrads
  bool grad_accumulation_fusion = true;
  std::string symmetric_buffers = "none";     // none | params | all: buffers outside the allocator
  double tp_symmetric_mb = 0;                 // NCCL windows outside the allocator
  bool tp_copy_engine = false;                // parallel.tp_comm_backend = "copy_engine": peer buffers outside it
  // The GPU path: SDPA's fused attention (flash / memory-efficient: no seq x seq scores) and this
  // engine's CUDA kernels (in-place cross entropy, SwiGLU, fused QKV split). false: LibTorch's
  // compositions, as on the CPU (kept for comparison with the paper's formulas).
  bool fused_attention = true, fused_kernels = true;

  int dp() const { return world / (tp * pp); }
  int64_t global() const { return global_batch > 0 ? global_batch : micro_batch * dp(); }
  int64_t micro_batches() const { return global() / (micro_batch * dp()); }  // per step and dp rank
  // The first and last stages' layers this plan gives (pp_split resolved; 0: an even share).
  std::pair<int64_t, int64_t> stage_split() const;
  // The trainer's own errors for a layout or batch that does not divide (me::Error).
  void validate() const;
};

// One pipeline stage on one GPU (one tensor-parallel rank). Bytes.
struct StageMemory {
  int stage = 0;
  int64_t first_layer = 0, layers = 0;
  int64_t parameters = 0;    // this GPU's share of the stage (replicated ones counted here too)
  int64_t in_flight = 1;     // micro-batches whose activations are alive at the peak
  int dp = 1;                // the data-parallel ranks the distributed optimizer shards over
  double weights = 0;        // the parameters in the training dtype
  double gradients = 0;      // the main-grad buffer (fp32, or bf16)
  double optimizer_replicated = 0;  // fp32 masters (bf16/fp16 training) + moments, every dp rank
  double optimizer_sharded = 0;     // the same under the distributed optimizer (1 / dp of it)
  double activations_per_micro = 0;
  double activations = 0;    // in flight (and held-back weight gradients, pp_deferred_wgrads > 1)
  double logits_peak = 0;    // last stage: logits, their gradient (in place) and the output layer's
  double layer_peak = 0;     // one layer's backward working set (+ a recomputed layer's activations)
  double workspace = 0;      // cuBLAS workspaces, the step's token and label ids
  double symmetric = 0;      // of weights and gradients: allocated by NCCL (symmetric_buffers), not LibTorch
  double outside = 0;        // not in LibTorch's allocator: CUDA context, NCCL, symmetric buffers

  double optimizer(bool distributed) const { return distributed ? optimizer_sharded : optimizer_replicated; }
  double transient() const { return logits_peak > layer_peak ? logits_peak : layer_peak; }
  // LibTorch's allocator peak: what `peak GPU memory on rank 0` reports on this stage.
  double allocator_peak(bool distributed) const;
  // Everything the GPU must hold: the allocator peak, memory outside it, and the caching
  // allocator's fragmentation (kFragmentation of the peak).
  double total(bool distributed) const;
};

struct MemoryEstimate {
  MemoryPlan plan;
  std::vector<StageMemory> stages;  // every pipeline stage
  const StageMemory& first() const { return stages.front(); }
  const StageMemory& last() const { return stages.back(); }
  // The stage needing the most memory (with the plan's optimizer setting).
  const StageMemory& worst() const;
  double total() const { return worst().total(plan.distributed_optimizer); }
};

// Constants the estimate adds (documented in memory_estimate.cpp with their sources).
constexpr double kWorkspaceBytes = 64.0 * 1048576;   // LibTorch's cuBLAS workspaces in the allocator
constexpr double kCudaContextBytes = 1024.0 * 1048576;  // CUDA context, kernels, our cuBLASLt workspaces
constexpr double kNcclGroupBytes = 256.0 * 1048576;  // NCCL's buffers per communicator in use
constexpr double kFragmentation = 0.05;             // caching-allocator slack over the allocated peak

// This GPU's parameters of pipeline stage `stage` of `stages` (layers split as first_layers /
// last_layers say, 0: even). per_rank: one tensor-parallel rank's (replicated weights counted on
// each); otherwise the stage's whole count (each weight once, as parameter_count counts them,
// the last stage's copy of a tied embedding included).
int64_t stage_parameters(const model::TransformerConfig& c, int tp, const model::PipelineStage& stage, bool per_rank);

// Bytes of activations one transformer layer keeps for backward, per micro-batch, on one GPU.
double layer_activation_bytes(const MemoryPlan& plan, bool recomputed);

MemoryEstimate estimate_memory(const MemoryPlan& plan);

}  // namespace me::plan
