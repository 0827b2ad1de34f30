// The decoder-only transformer that GPT and LLaMA share, built from tensor-parallel layers:
// with no tensor-parallel group it is the plain single-process model (tp = 1 is the same
// code, not a second copy). Activations are [batch, seq, hidden]; under sequence parallelism
// each rank holds seq / tp positions outside the attention and MLP.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>

#include "engine/model/pipeline_stage.h"
#include "engine/model/transformer_config.h"
#include "engine/parallel/layers.h"
#include "engine/parallel/state_tensor.h"

namespace me::model {

using parallel::TensorParallel;
class BlockGraphs;  // model/block_graphs.h

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

// The residual stream between blocks with its last addition still to do: the stream is
// x + delta. The next norm forms the sum as it normalises it (Norm::add_forward: one fused
// pass instead of an add and a norm); delta undefined: the stream is x.
struct Residual {
  torch::Tensor x, delta;
  torch::Tensor sum() const { return delta.defined() ? x + delta : x; }
};

// Pre-norm block: h = s + attn(norm1(s)), out = h + mlp(norm2(h)) for the stream s; returns
// out as {h, mlp(norm2(h))}, its last addition left to the next norm.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const TransformerConfig& c, TensorParallel tp, std::shared_ptr<parallel::Rotary> rope, bool recompute);
  Residual forward(const Residual& in);

 private:
  Residual body(const Residual& in);
  bool recompute_;
  parallel::Norm norm1_{nullptr}, norm2_{nullptr};
  Attention attn_{nullptr};
  MLP mlp_{nullptr};
  std::function<Residual(const Residual&)> body_fn_;  // for full recomputation
};
TORCH_MODULE(Block);

class TransformerImpl : public torch::nn::Module {
 public:
  // initialize = false: the weights are allocated but hold no values until reset_parameters
  // (for callers that draw them with their own seed: one draw instead of two).
  explicit TransformerImpl(const TransformerConfig& cfg, TensorParallel tp = {}, PipelineStage stage = {},
                           bool initialize = true);

  // The whole model (not a pipeline stage):
  // tokens [batch, seq] -> this rank's vocabulary slice of the logits [batch, seq, vocab / tp]
  torch::Tensor forward(const torch::Tensor& tokens);
  // All of the (padded) vocabulary: gathers the slices (for sampling and tests).
  torch::Tensor full_logits(const torch::Tensor& tokens);
  // Mean next-token cross entropy, computed on the vocabulary slices (never gathered).
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& labels);

  // This stage alone: its input (tokens on the first stage, the previous stage's hidden states
  // [batch, seq (/ tp under sequence parallelism), hidden] otherwise) -> its hidden states, or
  // on the last stage the logits' vocabulary slice. stage_loss: the last stage's loss.
  torch::Tensor forward_stage(const torch::Tensor& input);
  torch::Tensor stage_loss(const torch::Tensor& input, const torch::Tensor& labels);
  const PipelineStage& stage() const { return stage_; }
  int64_t first_layer() const { return first_layer_; }
  int64_t last_layer() const { return first_layer_ + static_cast<int64_t>(blocks_->size()) - 1; }
  // With tied embeddings over several stages: the first and last stages each hold the word
  // embedding, whose gradients must be summed over the embedding group before the update.
  bool holds_shared_embedding() const;

  const TransformerConfig& config() const { return cfg_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  int64_t local_parameter_count() const;

  // Every weight drawn at full size on the CPU from generators seeded by (seed, parameter name)
  // (in parallel chunks), then sliced: the same seed gives the same model whatever the layout
  // or device.
  void reset_parameters(uint64_t seed);
  // How each local parameter relates to the full one (by parameter name).
  const std::map<std::string, parallel::ShardInfo>& shards() const { return shards_; }
  // Called with each part (the embeddings, each block, the final norm and head) just before
  // forward_stage runs it: the distributed optimizer's overlapped all-gather of updated
  // parameters waits there for that part's weights only.
  using BeforeUse = std::function<void(torch::nn::Module&)>;
  void set_before_use(BeforeUse fn) { before_use_ = std::move(fn); }
  // The blocks run through these (train.cuda_graphs: model/block_graphs.h); null: eagerly.
  void set_block_graphs(std::shared_ptr<BlockGraphs> graphs) { graphs_ = std::move(graphs); }
  size_t block_count() const { return blocks_->size(); }

  // After backward under sequence parallelism: all-reduce over TP the gradients of
  // replicated parameters that only saw this rank's tokens (norms, row biases).
  void finalize_sequence_parallel_grads();

  // The name a parameter has in the whole model ("blocks.3.x" of stage 1 of 2 with 8 layers is
  // "blocks.7.x"): initialisation is seeded by it, so every layout starts from the same weights;
  // checkpoints name tensors by it.
  std::string global_name(const std::string& local) const;
  // This rank's parameters as pieces of the whole model's ("model.<global name>"), in
  // parameters() order, for checkpoints. `save` marks the one copy that is written: tensor-parallel
  // rank 0's of a replicated parameter, the first stage's of the tied word embedding.
  std::vector<parallel::StateTensor> state_tensors(int tp_rank) const;

 private:
  torch::Tensor embed(const torch::Tensor& tokens);

  TransformerConfig cfg_;
  TensorParallel tp_;
  PipelineStage stage_;
  int64_t first_layer_ = 0;
  parallel::VocabParallelEmbedding embedding_{nullptr};
  torch::nn::Embedding position_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  parallel::Norm final_norm_{nullptr};
  parallel::ColumnParallelLinear output_{nullptr};  // untied head only
  std::map<std::string, parallel::ShardInfo> shards_;
  BeforeUse before_use_;
  std::shared_ptr<BlockGraphs> graphs_;
};
TORCH_MODULE(Transformer);

// The module tree with per-rank shapes and counts, for `print(model)`.
std::string describe_model(const TransformerImpl& model);

// Autoregressive sampling: appends `count` tokens to `prompt` (greedy when top_k == 1). Under
// tensor parallelism every rank of the group must call it together (same seed: same tokens).
std::vector<int64_t> generate(Transformer& model, std::vector<int64_t> prompt, int64_t count, int64_t top_k,
                              double temperature, uint64_t seed);
// The same over any source of logits: `last_logits(tokens [1, s])` returns the (padded)
// vocabulary's logits at the last position, [vocab >= config.vocab] (a pipeline's last stage
// computes them and shares them with the other stages).
using LastLogits = std::function<torch::Tensor(const torch::Tensor& tokens)>;
// tokens [batch, len] right-padded to a length sequence parallelism can split (a multiple of
// tp; model.seq is one, so a prompt that fits still fits): causal attention keeps the padding
// from the real tokens, whose logits stay at positions 0..len-1.
torch::Tensor pad_for_sequence_parallel(const torch::Tensor& tokens, const TensorParallel& tp);
std::vector<int64_t> generate(const LastLogits& last_logits, const TransformerConfig& config, torch::Device device,
                              std::vector<int64_t> prompt, int64_t count, int64_t top_k, double temperature,
                              uint64_t seed);

}  // namespace me::model
