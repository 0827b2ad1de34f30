// The decoder-only transformer that GPT and LLaMA share, built from tensor-parallel layers:
// with no tensor-parallel group it is the plain single-process model (tp = 1 is the same
// code, not a second copy). Activations are [batch, seq, hidden]; under sequence parallelism
// each rank holds seq / tp positions outside the attention and MLP.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>

#include "engine/model/transformer_config.h"
#include "engine/parallel/layers.h"

namespace me::model {

using parallel::TensorParallel;

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const TransformerConfig& c, TensorParallel tp, std::shared_ptr<parallel::Rotary> rope);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor core(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);
  int64_t heads_, groups_, head_dim_;
  bool selective_recompute_;
  std::shared_ptr<parallel::Rotary> rope_;
  // One projection for queries, keys and values (one GEMM), rows grouped as Megatron's
  // linear_qkv: per key/value group, its heads/groups query heads, then its key, then its value.
  // Tensor parallelism splits whole groups, so the layout does not depend on tp.
  parallel::ColumnParallelLinear qkv_{nullptr};
  parallel::RowParallelLinear proj_{nullptr};
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)> core_fn_;
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(const TransformerConfig& c, TensorParallel tp);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  bool swiglu_;
  // SwiGLU's gate and up projections as one GEMM, rows interleaved (gate 0, up 0, gate 1, ...)
  // so that any tensor-parallel slice holds matching pairs.
  parallel::ColumnParallelLinear fc1_{nullptr}, gate_up_{nullptr};
  parallel::RowParallelLinear fc2_{nullptr}, down_{nullptr};
};
TORCH_MODULE(MLP);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const TransformerConfig& c, TensorParallel tp, std::shared_ptr<parallel::Rotary> rope, bool recompute);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor body(const torch::Tensor& x);
  torch::Tensor norm(int which, const torch::Tensor& x);
  bool recompute_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  parallel::RMSNorm rms1_{nullptr}, rms2_{nullptr};
  Attention attn_{nullptr};
  MLP mlp_{nullptr};
  std::function<torch::Tensor(const torch::Tensor&)> body_fn_;  // for full recomputation
};
TORCH_MODULE(Block);

class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const TransformerConfig& cfg, TensorParallel tp = {});

  // tokens [batch, seq] -> this rank's vocabulary slice of the logits [batch, seq, vocab / tp]
  torch::Tensor forward(const torch::Tensor& tokens);
  // All of the (padded) vocabulary: gathers the slices (for sampling and tests).
  torch::Tensor full_logits(const torch::Tensor& tokens);
  // Mean next-token cross entropy, computed on the vocabulary slices (never gathered).
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& labels);

  const TransformerConfig& config() const { return cfg_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  int64_t local_parameter_count() const;

  // Every weight drawn at full size from a generator seeded by (seed, parameter name), then
  // sliced: the same seed gives the same model whatever the layout or device.
  void reset_parameters(uint64_t seed);
  // How each local parameter relates to the full one (by parameter name).
  const std::map<std::string, parallel::ShardInfo>& shards() const { return shards_; }
  // After backward under sequence parallelism: all-reduce over TP the gradients of
  // replicated parameters that only saw this rank's sequence slice (norms, row biases).
  void finalize_sequence_parallel_grads();

 private:
  torch::Tensor hidden_states(const torch::Tensor& tokens);

  TransformerConfig cfg_;
  TensorParallel tp_;
  parallel::VocabParallelEmbedding embedding_{nullptr};
  torch::nn::Embedding position_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm final_ln_{nullptr};
  parallel::RMSNorm final_rms_{nullptr};
  parallel::ColumnParallelLinear output_{nullptr};  // untied head only
  std::map<std::string, parallel::ShardInfo> shards_;
};
TORCH_MODULE(Transformer);

// The module tree with per-rank shapes and counts, for `print(model)`.
std::string describe_model(const TransformerImpl& model);

// Autoregressive sampling: appends `count` tokens to `prompt` (greedy when top_k == 1). Under
// tensor parallelism every rank of the group must call it together (same seed: same tokens).
std::vector<int64_t> generate(Transformer& model, std::vector<int64_t> prompt, int64_t count, int64_t top_k,
                              double temperature, uint64_t seed);

}  // namespace me::model
