// Gradient-accumulation fusion (Megatron's gradient_accumulation_fusion): a linear layer's
// weight-gradient GEMM writes, or adds, its result straight into the main-grad buffer, in the
// buffer's dtype (fp32, or bf16 under parallel.grad_reduce_dtype).
// Without it the GEMM produces a bf16 gradient that a hook widens and copies into the buffer:
// one more pass over every weight per micro-batch, and a bf16 rounding the fp32 output avoids.
#pragma once
#include <torch/torch.h>

namespace me::parallel {

// Where weight gradients go (train::GradBuffer implements it).
class MainGradSink {
 public:
  virtual ~MainGradSink() = default;
  // The main grad of `param` (fp32, or bf16 under parallel.grad_reduce_dtype), shaped like it,
  // and whether it already holds a gradient of this step (add to it) or not (overwrite it).
  // Undefined when `param` is not in the buffer: the caller hands its gradient to autograd as usual.
  virtual torch::Tensor main_grad(const torch::Tensor& param, bool* accumulate) = 0;
  // The gradient of `param` for this micro-batch is in place (its bucket may start reducing).
  virtual void mark_written(const torch::Tensor& param) = 0;
};

}  // namespace me::parallel
