// The optimizer over fp32 master weights, as Megatron's mixed-precision and distributed
// optimizers arrange it. Masters are the fp32 parameters themselves (fp32 training), fp32
// copies (bf16 training), or with the distributed optimizer (ZeRO-1) only this data-parallel
// rank's shard of all of them (its piece of every gradient bucket, see parallel::FlatLayout), with the
// Adam state of that shard alone.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/comm/process_group.h"
#include "engine/core/side_stream.h"
#include "engine/kernels/fused_ops.h"
#include "engine/optim/adamw.h"
#include "engine/parallel/state_tensor.h"
#include "engine/parallel/flat_layout.h"

namespace me::optim {

struct MasterParam {
  torch::Tensor param;       // the model's parameter
  bool decay = true;         // weight decay applies (matrices, embeddings; not biases or norms)
  // false on TP ranks > 0 for parameters replicated across TP, and on the last pipeline
  // stage for its copy of the tied word embedding
  bool count_in_norm = true;
};

// The recipe's optimizer section, and how it is laid over data parallelism (the parallel section's
// distributed_optimizer and overlap_param_gather).
struct OptimizerConfig {
  OptimizerOptions options;
  bool distributed = false;    // shard masters and state over the data-parallel group
  // distributed: step() returns with the updated parameters' all-gathers still running (on a
  // side stream on the GPU); wait_for / wait_params before reading a parameter
  bool overlap_param_gather = false;
};

class MasterOptimizer {
 public:
  // `flat_grads` is the data-parallel gradient buffer (GradBuffer::flat) laid out as `layout`;
  // under the distributed optimizer only this rank's shard of it is reduced, and `flat_params`
  // (GradBuffer::adopt_params) holds the parameters in the same layout, so that the updated
  // shards are all-gathered in place. model_parallel (the TP x PP ranks holding one copy of the
  // model, over which the gradient norm is summed) and dp may be null.
  MasterOptimizer(std::vector<MasterParam> params, const torch::Tensor& flat_grads, parallel::FlatLayout layout,
                  OptimizerConfig cfg, comm::ProcessGroup* model_parallel, comm::ProcessGroup* dp,
                  const torch::Tensor& flat_params = {});

  // Clips, steps at `lr` and writes the new weights into the model's parameters. Returns the
  // gradient norm before clipping; a non-finite norm skips the update (returned as is).
  double step(double lr);

  // With overlap_param_gather: the current stream waits for (the host, on the CPU, waits for)
  // the all-gather of `param`'s bucket, or of every bucket. No-ops when nothing is in flight.
  void wait_for(const torch::Tensor& param);
  void wait_params();

  // Bytes of fp32 masters and optimizer state held on this rank, and what an unsharded
  // optimizer would hold (for the distributed optimizer's saving).
  int64_t state_bytes() const { return state_bytes_; }
  int64_t unsharded_state_bytes() const { return unsharded_bytes_; }

  // For checkpoints: this rank's fp32 masters (when they are copies, not the bf16/fp16 parameters
  // themselves) and optimizer state (adamw: exp_avg, exp_avg_sq; sgd: momentum), each a piece of
  // its parameter's slice (its segment inside this rank's shard under the distributed optimizer).
  // `params`: the model's pieces (Transformer::state_tensors), one per parameter in this
  // optimizer's order, named "model.<global name>". Writing into the returned tensors changes
  // the optimizer's state (a load).
  std::vector<parallel::StateTensor> state_tensors(const std::vector<parallel::StateTensor>& params) const;
  int64_t steps() const { return steps_; }  // updates applied (Adam's bias correction counts them)
  // The host's time blocked reading the gradient norm back since the last call (the step's one
  // wait for the device): near 0 on a rank whose host, not its GPU, sets the pace.
  double take_norm_wait_ms();
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  bool sharded() const { return cfg_.distributed && dp_ != nullptr; }
  void make_fused();
  double global_norm();
  // `clip`: the factor the gradients are scaled by (1: not clipped).
  void update(double lr, double clip);
  void write_back();

  std::vector<MasterParam> params_;
  torch::Tensor flat_grads_, flat_params_;
  parallel::FlatLayout layout_;
  OptimizerConfig cfg_;
  comm::ProcessGroup *model_parallel_, *dp_;
  // One entry per master tensor: a whole parameter, or the piece of it inside this shard.
  struct Segment {
    size_t param;
    int64_t start, length;  // range inside the parameter (flattened)
    torch::Tensor master, grad, m, v;
  };
  std::vector<Segment> segments_;
  std::vector<parallel::FlatRange> shard_;  // the ranges of the flat buffers this rank updates
  int64_t steps_ = 0;
  double norm_wait_ms_ = 0;  // see take_norm_wait_ms
  torch::Tensor step_count_, grad_divisor_;  // device scalars for LibTorch's fused AdamW kernel
  // engine/kernels' multi-tensor norm and AdamW (GPU, adamw): made at the first step; when it
  // refreshes the bf16 parameters itself, write_back has nothing left to do.
  std::unique_ptr<kernels::MultiTensorAdamW> fused_;
  bool fused_writes_model_ = false;
  int64_t state_bytes_ = 0, unsharded_bytes_ = 0;
  // distributed: each bucket's all-gather in flight, and which bucket a parameter is in
  std::vector<comm::WorkPtr> gathers_;
  std::unordered_map<const void*, size_t> bucket_of_;
  SideStream gather_stream_;
};

}  // namespace me::optim
