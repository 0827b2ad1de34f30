// AdamW with decoupled weight decay (Loshchilov & Hutter; PyTorch's and Megatron's update),
// over parameter groups so biases and norm weights can go undecayed.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "engine/optim/optimizer_options.h"

namespace me::optim {

struct ParamGroup {
  std::vector<torch::Tensor> params;
  double weight_decay = 0.0;
};

// One AdamW update of fp32 tensors `params` (masters) from their fp32 gradients, with moments
// m and v, at optimizer step `step` (1 = first), as multi-tensor (_foreach) kernels: a handful
// of launches for the whole list instead of several per tensor. Shared by AdamW and
// MasterOptimizer.
void adamw_update(std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                  std::vector<torch::Tensor>& m, std::vector<torch::Tensor>& v, double lr, double weight_decay,
                  const OptimizerOptions& options, int64_t step);

// Megatron's rule: matrices and embeddings decay; biases and norm weights (1-D) do not.
std::vector<ParamGroup> decay_groups(const std::vector<torch::Tensor>& params, double weight_decay);

class AdamW {
 public:
  AdamW(std::vector<ParamGroup> groups, OptimizerOptions options);  // betas and eps used

  // One update at learning rate `lr`; parameters without a gradient are left alone.
  void step(double lr);
  void zero_grad();
  int64_t steps() const { return step_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }

 private:
  std::vector<ParamGroup> groups_;
  OptimizerOptions cfg_;
  std::vector<std::vector<torch::Tensor>> exp_avg_, exp_avg_sq_;  // per group, per param
  int64_t step_ = 0;
};

// Gradient clipping over the global norm lives in MasterOptimizer, which knows the TP/DP groups.

}  // namespace me::optim
