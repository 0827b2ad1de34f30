// A GPT as Megatron and nanoGPT build it: token + learned position embeddings, pre-LayerNorm
// blocks (causal self-attention, GeLU MLP), final LayerNorm, LM head tied to the embedding.
#pragma once
#include <torch/torch.h>

#include "engine/model/gpt_config.h"

namespace me::model {

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const GPTConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);  // [batch, seq, hidden]

 private:
  int64_t heads_, head_dim_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(const GPTConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(MLP);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GPTConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  MLP mlp_{nullptr};
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const GPTConfig& cfg);

  // tokens [batch, seq] int64 -> logits [batch, seq, vocab]
  torch::Tensor forward(const torch::Tensor& tokens);
  // Mean cross entropy of next-token prediction.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& labels);

  const GPTConfig& config() const { return cfg_; }
  int64_t parameter_count() const;

  // Initialises every weight from `seed` alone, so two runs (or two layouts, later) start equal.
  void reset_parameters(uint64_t seed);

 private:
  GPTConfig cfg_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};  // only when embeddings are untied
};
TORCH_MODULE(GPT);

// A module tree with per-parameter shapes and counts, for `print(model)`.
std::string describe_module(const torch::nn::Module& module);

// Autoregressive sampling: appends `count` tokens to `prompt` (greedy when top_k == 1).
std::vector<int64_t> generate(GPT& model, std::vector<int64_t> prompt, int64_t count, int64_t top_k,
                              double temperature, uint64_t seed);

}  // namespace me::model
