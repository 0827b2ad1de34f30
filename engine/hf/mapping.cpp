#include "engine/hf/mapping.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"

namespace me::hf {

using nlohmann::json;

namespace {

// The sizes a shape is made of, resolved against the config.
enum class Dim { vocab, hidden, seq, qkv, q, ffn, ffn2 };
// Which models have the tensor.
enum class Need { always, linear_bias, untied };

struct Row {
  const char* ours;             // "{i}": the layer
  std::vector<const char*> hf;  // likewise
  Transform transform;
  std::vector<Dim> shape;
  Need need = Need::always;
};

using T = Transform;
using D = Dim;

// ---- the tables: one row per tensor of ours --------------------------------------------------

const std::vector<Row>& llama_rows() {
  static const std::vector<Row> rows = {
      {"embedding.weight", {"model.embed_tokens.weight"}, T::vocab_rows, {D::vocab, D::hidden}},
      {"blocks.{i}.norm1.weight", {"model.layers.{i}.input_layernorm.weight"}, T::copy, {D::hidden}},
      {"blocks.{i}.attn.qkv.weight",
       {"model.layers.{i}.self_attn.q_proj.weight", "model.layers.{i}.self_attn.k_proj.weight",
        "model.layers.{i}.self_attn.v_proj.weight"},
       T::qkv_grouped, {D::qkv, D::hidden}},
      {"blocks.{i}.attn.qkv.bias",
       {"model.layers.{i}.self_attn.q_proj.bias", "model.layers.{i}.self_attn.k_proj.bias",
        "model.layers.{i}.self_attn.v_proj.bias"},
       T::qkv_grouped, {D::qkv}, Need::linear_bias},
      {"blocks.{i}.attn.proj.weight", {"model.layers.{i}.self_attn.o_proj.weight"}, T::copy, {D::hidden, D::q}},
      {"blocks.{i}.attn.proj.bias", {"model.layers.{i}.self_attn.o_proj.bias"}, T::copy, {D::hidden}, Need::linear_bias},
      {"blocks.{i}.norm2.weight", {"model.layers.{i}.post_attention_layernorm.weight"}, T::copy, {D::hidden}},
      {"blocks.{i}.mlp.gate_up.weight", {"model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.up_proj.weight"},
       T::gate_up, {D::ffn2, D::hidden}},
      {"blocks.{i}.mlp.gate_up.bias", {"model.layers.{i}.mlp.gate_proj.bias", "model.layers.{i}.mlp.up_proj.bias"},
       T::gate_up, {D::ffn2}, Need::linear_bias},
      {"blocks.{i}.mlp.down.weight", {"model.layers.{i}.mlp.down_proj.weight"}, T::copy, {D::hidden, D::ffn}},
      {"blocks.{i}.mlp.down.bias", {"model.layers.{i}.mlp.down_proj.bias"}, T::copy, {D::hidden}, Need::linear_bias},
      {"final_norm.weight", {"model.norm.weight"}, T::copy, {D::hidden}},
      {"output.weight", {"lm_head.weight"}, T::vocab_rows, {D::vocab, D::hidden}, Need::untied},
  };
  return rows;
}

const std::vector<Row>& gpt2_rows() {
  static const std::vector<Row> rows = {
      {"embedding.weight", {"transformer.wte.weight"}, T::vocab_rows, {D::vocab, D::hidden}},
      {"position.weight", {"transformer.wpe.weight"}, T::position, {D::seq, D::hidden}},
      {"blocks.{i}.norm1.weight", {"transformer.h.{i}.ln_1.weight"}, T::copy, {D::hidden}},
      {"blocks.{i}.norm1.bias", {"transformer.h.{i}.ln_1.bias"}, T::copy, {D::hidden}},
      {"blocks.{i}.attn.qkv.weight", {"transformer.h.{i}.attn.c_attn.weight"}, T::qkv_conv1d, {D::qkv, D::hidden}},
      {"blocks.{i}.attn.qkv.bias", {"transformer.h.{i}.attn.c_attn.bias"}, T::qkv_conv1d, {D::qkv}, Need::linear_bias},
      {"blocks.{i}.attn.proj.weight", {"transformer.h.{i}.attn.c_proj.weight"}, T::conv1d, {D::hidden, D::q}},
      {"blocks.{i}.attn.proj.bias", {"transformer.h.{i}.attn.c_proj.bias"}, T::conv1d, {D::hidden}, Need::linear_bias},
      {"blocks.{i}.norm2.weight", {"transformer.h.{i}.ln_2.weight"}, T::copy, {D::hidden}},
      {"blocks.{i}.norm2.bias", {"transformer.h.{i}.ln_2.bias"}, T::copy, {D::hidden}},
      {"blocks.{i}.mlp.fc1.weight", {"transformer.h.{i}.mlp.c_fc.weight"}, T::conv1d, {D::ffn, D::hidden}},
      {"blocks.{i}.mlp.fc1.bias", {"transformer.h.{i}.mlp.c_fc.bias"}, T::conv1d, {D::ffn}, Need::linear_bias},
      {"blocks.{i}.mlp.fc2.weight", {"transformer.h.{i}.mlp.c_proj.weight"}, T::conv1d, {D::hidden, D::ffn}},
      {"blocks.{i}.mlp.fc2.bias", {"transformer.h.{i}.mlp.c_proj.bias"}, T::conv1d, {D::hidden}, Need::linear_bias},
      {"final_norm.weight", {"transformer.ln_f.weight"}, T::copy, {D::hidden}},
      {"final_norm.bias", {"transformer.ln_f.bias"}, T::copy, {D::hidden}},
      {"output.weight", {"lm_head.weight"}, T::vocab_rows, {D::vocab, D::hidden}, Need::untied},
  };
  return rows;
}

// ---- expanding the tables ------------------------------------------------------------------

std::string with_layer(const std::string& pattern, int64_t layer) {
  const auto at = pattern.find("{i}");
  return at == std::string::npos ? pattern : pattern.substr(0, at) + std::to_string(layer) + pattern.substr(at + 3);
}

int64_t resolve(Dim d, const model::TransformerConfig& c) {
  switch (d) {
    case Dim::vocab: return c.vocab;
    case Dim::hidden: return c.hidden;
    case Dim::seq: return c.seq;
    case Dim::qkv: return (c.heads + 2 * c.groups()) * c.head_dim();
    case Dim::q: return c.heads * c.head_dim();
    case Dim::ffn: return c.ffn();
    case Dim::ffn2: return 2 * c.ffn();
  }
  return 0;
}

std::vector<std::vector<int64_t>> hf_shapes_of(Transform t, const std::vector<int64_t>& ours,
                                               const model::TransformerConfig& c) {
  const std::vector<int64_t> rest(ours.begin() + 1, ours.end());
  auto rows = [&](int64_t n) {
    std::vector<int64_t> s{n};
    s.insert(s.end(), rest.begin(), rest.end());
    return s;
  };
  switch (t) {
    case T::copy:
    case T::vocab_rows:
    case T::position: return {ours};
    case T::conv1d: return {ours.size() == 2 ? std::vector<int64_t>{ours[1], ours[0]} : ours};
    case T::qkv_grouped: {
      const int64_t kv = c.groups() * c.head_dim();
      return {rows(c.heads * c.head_dim()), rows(kv), rows(kv)};
    }
    case T::qkv_conv1d: return {ours.size() == 2 ? std::vector<int64_t>{ours[1], ours[0]} : ours};
    case T::gate_up: return {rows(ours[0] / 2), rows(ours[0] / 2)};
  }
  return {};
}

bool wanted(Need n, const model::TransformerConfig& c) {
  return n == Need::always || (n == Need::linear_bias && c.bias) || (n == Need::untied && !c.tie_embeddings);
}

}  // namespace

const char* family_name(Family f) { return f == Family::llama ? "llama" : "gpt2"; }

Family family_of(const model::TransformerConfig& c) {
  if (c.norm == "rmsnorm" && c.activation == "swiglu" && c.position == "rope") return Family::llama;
  if (c.norm == "layernorm" && c.activation == "gelu" && c.position == "learned" && c.bias && c.groups() == c.heads)
    return Family::gpt2;
  fail("this model (norm = ", c.norm, ", activation = ", c.activation, ", position = ", c.position,
       ", bias = ", c.bias ? "true" : "false", ", query_groups = ", c.groups(), " of ", c.heads,
       " heads) has neither LLaMA's architecture (rmsnorm, swiglu, rope) nor GPT-2's (layernorm, gelu, learned, ",
       "bias = true, query_groups = heads): transformers has no class that loads it");
}

std::vector<TensorMap> tensor_maps(const model::TransformerConfig& c) {
  const auto& rows = family_of(c) == Family::llama ? llama_rows() : gpt2_rows();
  std::vector<TensorMap> out;
  auto add = [&](const Row& r, int64_t layer) {
    if (!wanted(r.need, c)) return;
    TensorMap m;
    m.ours = with_layer(r.ours, layer);
    for (const char* h : r.hf) m.hf.push_back(with_layer(h, layer));
    m.transform = r.transform;
    for (const Dim d : r.shape) m.shape.push_back(resolve(d, c));
    m.hf_shapes = hf_shapes_of(r.transform, m.shape, c);
    out.push_back(std::move(m));
  };
  auto layered = [](const Row& r) { return std::string(r.ours).find("{i}") != std::string::npos; };
  for (const auto& r : rows)  // embeddings
    if (!layered(r) && std::string(r.ours).rfind("final_norm", 0) != 0 && std::string(r.ours) != "output.weight") add(r, 0);
  for (int64_t i = 0; i < c.layers; ++i)
    for (const auto& r : rows)
      if (layered(r)) add(r, i);
  for (const auto& r : rows)  // final norm, head
    if (!layered(r) && (std::string(r.ours).rfind("final_norm", 0) == 0 || std::string(r.ours) == "output.weight"))
      add(r, 0);
  return out;
}

std::vector<std::string> hf_name_variants(const std::string& name) {
  const std::string prefix = "transformer.";
  if (name.rfind(prefix, 0) == 0) return {name, name.substr(prefix.size())};
  return {name};
}

bool ignorable_hf_tensor(const std::string& name, const model::TransformerConfig& c) {
  auto ends = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  // GPT-2's causal-mask buffers (older transformers saved them), LLaMA's rotary frequencies,
  // and a tied head saved anyway.
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends("rotary_emb.inv_freq") ||
         (c.tie_embeddings && name == "lm_head.weight");
}

}  // namespace me::hf
