// Tensor-parallel layers (Megatron-Core's tensor_parallel/layers.py, for [batch, seq, hidden]
// activations). Each holds only its shard; `ShardInfo` says how the shard relates to the full
// parameter, so initialisation and checks can work on the full, layout-independent tensor.
#pragma once
#include <torch/torch.h>

#include "engine/kernels/fp8_linear.h"
#include "engine/kernels/fused_ops.h"
#include "engine/parallel/main_grad.h"
#include "engine/parallel/tensor_parallel.h"

namespace me::parallel {

// How a local parameter is cut from the full one: along `dim` into tp equal parts (dim -1:
// replicated on every rank). `sequence_parallel_grad`: replicated, but each rank's gradient
// covers only its chunk of the tokens, so gradients are all-reduced over TP (norms, row biases
// under sequence parallelism).
struct ShardInfo {
  std::vector<int64_t> full_shape;
  int64_t dim = -1;
  bool sequence_parallel_grad = false;
};

// x [..., in] W^T + b (b may be undefined). With kernels::Op::linear_bias on the GPU: one addmm
// over x flattened to 2-D, the bias added in cuBLASLt's epilogue; LibTorch's linear on 3-D
// input adds a broadcast bias in a separate, strided elementwise kernel (4 per GPT layer).
torch::Tensor linear_bias(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b);

// How one linear layer communicates: its tensor-parallel role, and where its weight gradients go.
// - column: x is a column-parallel layer's input, all-gathered over the tokens first under
//   sequence parallelism (the GEMM starting on this rank's own tokens while the others arrive);
//   its gradient is reduced over TP in backward on a side stream, overlapped with the
//   weight-gradient GEMM (Megatron's LinearWithGradAccumulationAndAsyncCommunication).
// - row (sequence parallelism only): the output is a row-parallel layer's, reduce-scattered over
//   the tokens, each rank's rows sent as soon as they are computed (parallel/collective_matmul.h),
//   the bias added once after the sum; backward gathers the output gradient the same way, and
//   takes the bias's gradient from this rank's tokens.
// - local: no communication.
// `sink`: gradient-accumulation fusion, the backward writing the weight and bias gradients into
// its main grads instead of returning them to autograd (w must then feed no other operation: its
// gradient is marked complete as soon as this one is written); null: gradients to autograd.
// `fp8`: precision = "fp8", the three GEMMs in fp8 with this layer's scales and cached weight
// cast (kernels/fp8_linear.h); the input is gathered whole before its cast (no chunked overlap
// of the all-gather), the reduce-scatter of a row layer's output still overlapped.
struct LinearComm {
  enum class Role { local, column, row };
  Role role = Role::local;
  const TensorParallel* tp = nullptr;  // the group of a column or row layer
  MainGradSink* sink = nullptr;
  kernels::Fp8Linear* fp8 = nullptr;

  static LinearComm local(MainGradSink* sink, kernels::Fp8Linear* fp8 = nullptr) {
    return {Role::local, nullptr, sink, fp8};
  }
  static LinearComm column(const TensorParallel& tp, MainGradSink* sink, kernels::Fp8Linear* fp8 = nullptr) {
    return {Role::column, &tp, sink, fp8};
  }
  static LinearComm row(const TensorParallel& tp, MainGradSink* sink, kernels::Fp8Linear* fp8 = nullptr) {
    return {Role::row, &tp, sink, fp8};
  }
  // The group when this layer has that role and the group more than one rank; else null.
  const TensorParallel* column_tp() const { return role == Role::column && tp && tp->active() ? tp : nullptr; }
  const TensorParallel* row_tp() const { return role == Role::row && tp && tp->active() ? tp : nullptr; }
};

// x [..., in] w^T + b communicating as `comm` says. Plain linear_bias when neither TP nor the
// sink applies; without autograd, the same arithmetic as with it (recomputation runs the
// forward both ways).
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, const LinearComm& comm);
// linear(gelu(pre)) in fp8 (comm.fp8 set): GeLU applied inside the input's fp8 cast, so gelu(pre)
// is never written in bf16; backward multiplies by gelu'(pre). GPT's second MLP layer in fp8.
torch::Tensor linear_of_gelu(const torch::Tensor& pre, const torch::Tensor& w, const torch::Tensor& b,
                             const LinearComm& comm);

// GeLU (tanh form) between two linear layers inside the GEMMs' epilogues (kernels::Op::gemm_gelu):
// linear_gelu is linear() (a column or local layer) returning {pre, gelu(pre)} from one GEMM,
// the second without a gradient of its own; gelu_linear is the next layer's linear() (a row or
// local layer) on gelu(pre), its backward giving pre's gradient (dy w) * gelu'(pre) from one
// GEMM. Use through ColumnParallelLinear's forward_gelu and RowParallelLinear's forward_gelu,
// which pick the composition where the kernels do not apply.
kernels::Activated linear_gelu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                               const LinearComm& comm);
torch::Tensor gelu_linear(const kernels::Activated& a, const torch::Tensor& w, const torch::Tensor& b,
                          const LinearComm& comm);

// y = x A^T + b with A split by rows (output features). Input: the full activation, or this
// rank's chunk of the tokens under sequence parallelism (gathered here). Output: this rank's
// slice of the features, or all of them with gather_output.
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(int64_t in, int64_t out, bool bias, TensorParallel tp, bool gather_output = false);
  torch::Tensor forward(const torch::Tensor& x);
  // forward followed by tanh GeLU: {pre, gelu(pre)} for RowParallelLinear::forward_gelu (out
  // undefined where the GEMM epilogue does not apply: the consumer applies GeLU itself).
  kernels::Activated forward_gelu(const torch::Tensor& x);
  // The same with a weight owned elsewhere (a tied embedding), [out / tp, in].
  torch::Tensor forward_with(const torch::Tensor& x, const torch::Tensor& weight);
  std::vector<std::pair<std::string, ShardInfo>> shards() const;

  torch::Tensor weight, bias;
  MainGradSink* main_grads = nullptr;            // set by attach_main_grads
  std::shared_ptr<kernels::Fp8Linear> fp8;       // set by attach_fp8

 private:
  int64_t in_, out_;
  TensorParallel tp_;
  bool gather_output_;
};
TORCH_MODULE(ColumnParallelLinear);

// y = x A^T + b with A split by columns (input features): the input is already split (the
// output of a column-parallel layer); partial results are all-reduced, or reduce-scattered
// over the tokens under sequence parallelism. The bias is added once, after the reduction.
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(int64_t in, int64_t out, bool bias, TensorParallel tp);
  torch::Tensor forward(const torch::Tensor& x);
  // forward(gelu(a.pre)), from ColumnParallelLinear::forward_gelu's output (in fp8: GeLU inside the
  // input's cast, linear_of_gelu).
  torch::Tensor forward_gelu(const kernels::Activated& a);
  std::vector<std::pair<std::string, ShardInfo>> shards() const;

  torch::Tensor weight, bias;
  MainGradSink* main_grads = nullptr;       // set by attach_main_grads
  std::shared_ptr<kernels::Fp8Linear> fp8;  // set by attach_fp8

 private:
  torch::Tensor add_bias(const torch::Tensor& y);  // after the reduction over TP
  using LinearFn = torch::Tensor (*)(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const LinearComm&);
  torch::Tensor forward_product(const torch::Tensor& x, LinearFn product);  // product: linear or linear_of_gelu

  int64_t in_, out_;
  TensorParallel tp_;
};
TORCH_MODULE(RowParallelLinear);

// Gradient-accumulation fusion for every column- and row-parallel linear layer and vocabulary-
// parallel embedding of `model` (null: off again). The sink must outlive the model's backward passes.
void attach_main_grads(torch::nn::Module& model, MainGradSink* sink);

// precision = "fp8" for the column- and row-parallel layers of the transformer blocks (modules
// named "blocks.*"; the output layer stays in the training dtype), each with its own scales on
// its weight's device (null: off again). `fp8` must outlive the model.
void attach_fp8(torch::nn::Module& model, const kernels::Fp8Model* fp8);
// The fp8 states attach_fp8 made, in the model's module order.
std::vector<kernels::Fp8Linear*> fp8_layers(const torch::nn::Module& model);

// Embedding with the vocabulary split across TP ranks: each rank looks up the ids in its
// range and the partial results are summed (or reduce-scattered over the tokens).
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t hidden, TensorParallel tp);
  torch::Tensor forward(const torch::Tensor& tokens);
  // Logits over this rank's slice of the vocabulary from x [..., hidden] with this weight (the
  // tied output layer of a column-parallel LM head). `lookup_follows`: this stage also looks up
  // with the weight (a whole model), and that backward, which comes later, completes each
  // micro-batch's gradient.
  torch::Tensor logits(const torch::Tensor& x, bool lookup_follows);
  std::vector<std::pair<std::string, ShardInfo>> shards() const;
  int64_t vocab_start() const { return start_; }

  torch::Tensor weight;  // [vocab / tp, hidden]
  // Set by attach_main_grads: the lookup's backward adds its rows into the main grad (no dense
  // [vocab, hidden] gradient per micro-batch), and the tied output layer's GEMM writes there.
  MainGradSink* main_grads = nullptr;
  std::shared_ptr<MainGradSink> main_grads_first_part;  // main_grads, for the tied head before a lookup

 private:
  int64_t vocab_, hidden_, start_, local_;
  TensorParallel tp_;
};
TORCH_MODULE(VocabParallelEmbedding);

// Normalisation over the last dimension, statistics in fp32: LayerNorm (GPT: weight and bias)
// or RMSNorm (LLaMA: x / sqrt(mean(x^2) + eps) * weight). add_forward also forms the residual
// sum it normalises, x + delta: on the GPU one fused kernel each way (kernels::Op::add_norm)
// instead of an add and a norm, each a pass over the residual stream. delta undefined: no add
// (the sum is x).
class NormImpl : public torch::nn::Module {
 public:
  NormImpl(const std::string& kind, int64_t hidden, double eps);  // kind: layernorm | rmsnorm
  torch::Tensor forward(const torch::Tensor& x);
  struct Sum {
    torch::Tensor sum, y;  // x + delta, and its normalisation
  };
  Sum add_forward(const torch::Tensor& x, const torch::Tensor& delta);
  void pretty_print(std::ostream& os) const override;

  torch::Tensor weight, bias;  // bias: LayerNorm only

 private:
  bool rms_;
  int64_t hidden_;
  double eps_;
};
TORCH_MODULE(Norm);

// Cross entropy over logits split along the vocabulary ([batch, seq, vocab / tp] on each rank)
// without gathering them: max, target logit and sum of exponentials are all-reduced. Labels
// equal to ignore_index contribute nothing. Returns the mean over counted positions.
// vocab: the real vocabulary; the columns past it (the padding to a multiple of 128 x tp) are
// left out of the softmax, so that layouts whose padding differs give the same loss (< 0: no
// padding).
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels,
                                           const TensorParallel& tp, int64_t ignore_index = -100,
                                           int64_t vocab = -1);

// Rotary position embedding (RoPE), "rotate half" form as in LLaMA and Megatron: dimension i
// of the first half pairs with i + d/2, rotated by angle pos * base^(-2i/d).
class Rotary {
 public:
  Rotary(int64_t head_dim, int64_t max_seq, double base);
  // x: [batch, heads, seq, head_dim]; positions 0..seq-1.
  torch::Tensor apply(const torch::Tensor& x) const;
  // fp32 cos and sin of the first half's angles, [max_seq, head_dim / 2], on `device` (made
  // once): the fused kernel's tables.
  const torch::Tensor& cos_half(const torch::Device& device) const;
  const torch::Tensor& sin_half(const torch::Device& device) const;

 private:
  torch::Tensor cos_, sin_;  // [max_seq, head_dim], fp32 on the CPU
  // The tables on the device and in the dtype last asked for: made once, not every layer and step.
  mutable torch::Tensor cos_cached_, sin_cached_;
  mutable torch::Tensor cos_half_, sin_half_;
};

}  // namespace me::parallel
