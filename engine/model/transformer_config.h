// What defines a decoder-only transformer, as plain data (no LibTorch: the Lua bindings read
// and check it cheaply). Two families share it: GPT (learned positions, LayerNorm, GeLU,
// biases, tied embeddings) and LLaMA (RoPE, RMSNorm, SwiGLU, grouped-query attention, no
// biases, untied output); `kind` picks the family's defaults, fields may still differ.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

namespace me::model {

struct TransformerConfig {
  std::string kind = "gpt";  // gpt | llama
  int64_t vocab = 256;       // the tokenizer's vocabulary; padded for the model (padded_vocab)
  int64_t seq = 128;
  int64_t layers = 4;
  int64_t hidden = 128;
  int64_t heads = 4;
  int64_t query_groups = 0;  // key/value heads (GQA); 0 = heads (multi-head attention)
  int64_t ffn_hidden = 0;    // 0 = the family's rule (4h for GeLU; LLaMA's 2/3 * 4h rounded)
  double ffn_multiplier = 1.0;  // LLaMA's ffn_dim_multiplier (1.3 for 70B)
  int64_t ffn_multiple_of = 256;
  int64_t vocab_divisible_by = 128;  // Megatron pads the vocabulary to a multiple of this x tp
  std::string norm = "layernorm";    // layernorm | rmsnorm
  std::string activation = "gelu";   // gelu | swiglu
  std::string position = "learned";  // learned | rope
  bool bias = true;
  bool tie_embeddings = true;
  double norm_eps = 1e-5;
  double rope_base = 10000.0;
  double init_std = 0.02;  // output projections of residual branches: init_std / sqrt(2 * layers)
  std::string recompute = "none";  // none | selective (attention core) | full (whole layers)
  int64_t recompute_every = 1;     // with full: recompute every k-th layer

  static TransformerConfig gpt();
  static TransformerConfig llama();

  int64_t groups() const { return query_groups > 0 ? query_groups : heads; }
  int64_t head_dim() const { return hidden / heads; }
  int64_t ffn() const;
  int64_t padded_vocab(int tp = 1) const;

  // Throws me::Error naming the field ("model.hidden must be a positive integer, got 0");
  // with tp > 1 also what does not divide ("model.query_groups (8) is not divisible by tp (3)").
  void validate(const std::string& where = "model", int tp = 1, bool sequence_parallel = false) const;

  // Exact parameter count of the full (unsplit) model built from this config.
  int64_t parameter_count(int tp = 1) const;
  // Model FLOPs of forward + backward per token (Narayanan et al. 2021, generalised to GQA and
  // SwiGLU): 6 x (every matmul's weights, the output layer included) + 12 x layers x hidden x
  // seq for attention's scores and weighted values. Recomputation is not counted (model FLOPs).
  double flops_per_token(int tp = 1) const;
  // Its two parts: one transformer layer's, and the output layer's.
  double layer_flops_per_token() const;
  double output_flops_per_token(int tp = 1) const;
  std::string describe() const;
};

// Calls v("name", member) for every field, in bindings/lua/fields.lua's order: the recipe
// reader, the checkpoint's copy of the config and the test that the Lua defaults equal gpt()
// and llama() go through it. Config may be const or not.
template <class Config, class V,
          std::enable_if_t<std::is_same_v<std::remove_const_t<Config>, TransformerConfig>, int> = 0>
void visit_fields(Config& c, V&& v) {
  v("kind", c.kind);
  v("vocab", c.vocab);
  v("seq", c.seq);
  v("layers", c.layers);
  v("hidden", c.hidden);
  v("heads", c.heads);
  v("query_groups", c.query_groups);
  v("ffn_hidden", c.ffn_hidden);
  v("ffn_multiplier", c.ffn_multiplier);
  v("ffn_multiple_of", c.ffn_multiple_of);
  v("vocab_divisible_by", c.vocab_divisible_by);
  v("norm", c.norm);
  v("activation", c.activation);
  v("position", c.position);
  v("bias", c.bias);
  v("tie_embeddings", c.tie_embeddings);
  v("norm_eps", c.norm_eps);
  v("rope_base", c.rope_base);
  v("init_std", c.init_std);
  v("recompute", c.recompute);
  v("recompute_every", c.recompute_every);
}

}  // namespace me::model
