#include "engine/model/transformer_config.h"

#include "engine/core/error.h"

namespace me::model {

TransformerConfig TransformerConfig::gpt() { return TransformerConfig{}; }

TransformerConfig TransformerConfig::llama() {
  TransformerConfig c;
  c.kind = "llama";
  c.vocab = 32000;
  c.norm = "rmsnorm";
  c.activation = "swiglu";
  c.position = "rope";
  c.bias = false;
  c.tie_embeddings = false;
  c.norm_eps = 1e-5;
  return c;
}

int64_t TransformerConfig::ffn() const {
  if (ffn_hidden > 0) return ffn_hidden;
  if (activation != "swiglu") return 4 * hidden;
  // LLaMA: two thirds of 4h (SwiGLU has three matrices), times the multiplier, rounded up.
  int64_t f = 2 * 4 * hidden / 3;
  f = static_cast<int64_t>(ffn_multiplier * static_cast<double>(f));
  return ffn_multiple_of * ((f + ffn_multiple_of - 1) / ffn_multiple_of);
}

int64_t TransformerConfig::padded_vocab(int tp) const {
  const int64_t m = vocab_divisible_by * tp;
  return ((vocab + m - 1) / m) * m;
}

void TransformerConfig::validate(const std::string& where, int tp, bool sequence_parallel) const {
  auto positive = [&](const char* name, int64_t v) {
    ME_CHECK(v > 0, where, ".", name, " must be a positive integer, got ", v);
  };
  ME_CHECK(kind == "gpt" || kind == "llama", where, ".kind must be gpt or llama, got '", kind, "'");
  positive("vocab", vocab);
  positive("seq", seq);
  positive("layers", layers);
  positive("hidden", hidden);
  positive("heads", heads);
  positive("vocab_divisible_by", vocab_divisible_by);
  positive("ffn_multiple_of", ffn_multiple_of);
  ME_CHECK(query_groups >= 0, where, ".query_groups must be >= 0 (0: as many as heads), got ", query_groups);
  ME_CHECK(ffn_hidden >= 0, where, ".ffn_hidden must be a positive integer (or 0 for the default), got ", ffn_hidden);
  ME_CHECK(hidden % heads == 0, where, ".hidden (", hidden, ") must be divisible by ", where, ".heads (", heads, ")");
  ME_CHECK(heads % groups() == 0, where, ".heads (", heads, ") must be divisible by ", where, ".query_groups (",
           groups(), ")");
  ME_CHECK(norm == "layernorm" || norm == "rmsnorm", where, ".norm must be layernorm or rmsnorm, got '", norm, "'");
  ME_CHECK(activation == "gelu" || activation == "swiglu", where, ".activation must be gelu or swiglu, got '",
           activation, "'");
  ME_CHECK(position == "learned" || position == "rope", where, ".position must be learned or rope, got '", position,
           "'");
  ME_CHECK(position != "rope" || head_dim() % 2 == 0, where, ": rotary embeddings need an even head dimension, got ",
           head_dim());
  ME_CHECK(init_std > 0 && norm_eps > 0 && rope_base > 0 && ffn_multiplier > 0, where,
           ": init_std, norm_eps, rope_base and ffn_multiplier must be positive");
  ME_CHECK(recompute == "none" || recompute == "selective" || recompute == "full", where,
           ".recompute must be none, selective or full, got '", recompute, "'");
  positive("recompute_every", recompute_every);
  if (tp > 1) {
    ME_CHECK(heads % tp == 0, where, ".heads (", heads, ") is not divisible by tp (", tp, ")");
    ME_CHECK(groups() % tp == 0, where, ".query_groups (", groups(), ") is not divisible by tp (", tp,
             "): each tensor-parallel rank needs whole key/value groups");
    ME_CHECK(ffn() % tp == 0, where, ": the MLP width (", ffn(), ") is not divisible by tp (", tp, ")");
    if (sequence_parallel)
      ME_CHECK(seq % tp == 0, where, ".seq (", seq, ") is not divisible by tp (", tp, "), which sequence parallelism needs");
  }
}

int64_t TransformerConfig::parameter_count(int tp) const {
  const int64_t h = hidden, f = ffn(), d = head_dim(), q = heads * d, kv = groups() * d, v = padded_vocab(tp);
  const int64_t b = bias ? 1 : 0;
  const int64_t norm_params = norm == "layernorm" ? 2 * h : h;
  const int64_t attention = h * (q + 2 * kv) + b * (q + 2 * kv) + q * h + b * h;
  const int64_t mlp = activation == "swiglu" ? 3 * h * f + b * (2 * f + h) : 2 * h * f + b * (f + h);
  int64_t n = layers * (attention + mlp + 2 * norm_params) + norm_params + v * h;
  if (position == "learned") n += seq * h;
  if (!tie_embeddings) n += v * h;
  return n;
}

double TransformerConfig::layer_flops_per_token() const {
  const double h = static_cast<double>(hidden), f = static_cast<double>(ffn()), d = static_cast<double>(head_dim());
  const double q = static_cast<double>(heads) * d, kv = static_cast<double>(groups()) * d;
  const double weights = h * (q + 2 * kv) + q * h + (activation == "swiglu" ? 3 : 2) * h * f;
  return 6.0 * weights + 12.0 * q * static_cast<double>(seq);
}

double TransformerConfig::output_flops_per_token(int tp) const {
  return 6.0 * static_cast<double>(padded_vocab(tp)) * static_cast<double>(hidden);
}

double TransformerConfig::flops_per_token(int tp) const {
  return static_cast<double>(layers) * layer_flops_per_token() + output_flops_per_token(tp);
}

std::string TransformerConfig::describe() const {
  return cat(kind == "llama" ? "LLaMA" : "GPT", "(layers=", layers, ", hidden=", hidden, ", heads=", heads,
             groups() != heads ? cat(", query_groups=", groups()) : std::string(), ", ffn=", ffn(), ", seq=", seq,
             ", vocab=", vocab, ")");
}

}  // namespace me::model
