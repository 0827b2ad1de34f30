// config.json <-> TransformerConfig: LlamaConfig and GPT2Config, by the field names transformers
// documents (hf_mapping.h declares these).
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/hf/mapping.h"
#include "engine/core/error.h"

namespace me::hf {

using nlohmann::json;

namespace {

json token_id(int64_t id) { return id >= 0 ? json(id) : json(nullptr); }

json llama_config(const model::TransformerConfig& c) {
  return {{"architectures", json::array({"LlamaForCausalLM"})},
          {"model_type", "llama"},
          {"vocab_size", c.vocab},
          {"hidden_size", c.hidden},
          {"intermediate_size", c.ffn()},
          {"num_hidden_layers", c.layers},
          {"num_attention_heads", c.heads},
          {"num_key_value_heads", c.groups()},
          {"head_dim", c.head_dim()},
          {"hidden_act", "silu"},
          {"max_position_embeddings", c.seq},
          {"rms_norm_eps", c.norm_eps},
          {"rope_theta", c.rope_base},
          {"rope_scaling", nullptr},
          {"attention_bias", c.bias},
          {"mlp_bias", c.bias},
          {"attention_dropout", 0.0},
          {"pretraining_tp", 1},
          {"tie_word_embeddings", c.tie_embeddings},
          {"initializer_range", c.init_std},
          {"use_cache", true}};
}

json gpt2_config(const model::TransformerConfig& c) {
  return {{"architectures", json::array({"GPT2LMHeadModel"})},
          {"model_type", "gpt2"},
          {"vocab_size", c.vocab},
          {"n_positions", c.seq},
          {"n_embd", c.hidden},
          {"n_layer", c.layers},
          {"n_head", c.heads},
          {"n_inner", c.ffn()},
          {"activation_function", "gelu_new"},  // tanh-approximated, as ours
          {"layer_norm_epsilon", c.norm_eps},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"tie_word_embeddings", c.tie_embeddings},
          {"initializer_range", c.init_std},
          {"use_cache", true}};
}

// Typed reads of config.json's fields, each error naming the file and the field.
struct Reader {
  const json& j;
  const std::string& file;
  template <class V>
  V get(const char* key, V fallback) const {
    if (!j.contains(key) || j.at(key).is_null()) return fallback;
    try {
      return j.at(key).get<V>();
    } catch (const json::exception&) {
      fail("'", file, "': field '", key, "' has the wrong type (", j.at(key).dump(), ")");
    }
  }
  template <class V>
  V need(const char* key) const {
    ME_CHECK(j.contains(key) && !j.at(key).is_null(), "'", file, "' has no field '", key, "', which the model needs");
    return get<V>(key, V{});
  }
};

double rope_theta(const Reader& r) {
  // transformers 5 keeps it in rope_parameters; 4.x (and the Hub's files) at the top level.
  if (r.j.contains("rope_parameters") && r.j.at("rope_parameters").is_object()) {
    const auto& p = r.j.at("rope_parameters");
    const std::string type = p.value("rope_type", p.value("type", std::string("default")));
    ME_CHECK(type == "default", "'", r.file, "': rope_parameters.rope_type is '", type,
             "'; megaengine implements the default rotary embedding only (no scaling)");
    if (p.contains("rope_theta")) return p.at("rope_theta").get<double>();
  }
  if (r.j.contains("rope_scaling") && !r.j.at("rope_scaling").is_null()) {
    const auto& s = r.j.at("rope_scaling");
    const std::string type = s.is_object() ? s.value("rope_type", s.value("type", std::string("?"))) : "?";
    ME_CHECK(type == "default", "'", r.file, "': rope_scaling is '", type,
             "'; megaengine implements the default rotary embedding only (no scaling)");
  }
  return r.get<double>("rope_theta", 10000.0);
}

model::TransformerConfig llama_from(const Reader& r) {
  auto c = model::TransformerConfig::llama();
  c.vocab = r.need<int64_t>("vocab_size");
  c.hidden = r.need<int64_t>("hidden_size");
  c.ffn_hidden = r.need<int64_t>("intermediate_size");
  c.layers = r.need<int64_t>("num_hidden_layers");
  c.heads = r.need<int64_t>("num_attention_heads");
  c.query_groups = r.get<int64_t>("num_key_value_heads", c.heads);
  c.seq = r.get<int64_t>("max_position_embeddings", 2048);
  c.norm_eps = r.get<double>("rms_norm_eps", 1e-6);  // LlamaConfig's default
  c.rope_base = rope_theta(r);
  c.tie_embeddings = r.get<bool>("tie_word_embeddings", false);
  c.init_std = r.get<double>("initializer_range", 0.02);
  const bool attention_bias = r.get<bool>("attention_bias", false), mlp_bias = r.get<bool>("mlp_bias", false);
  ME_CHECK(attention_bias == mlp_bias, "'", r.file, "': attention_bias (", attention_bias, ") and mlp_bias (", mlp_bias,
           ") differ; megaengine's model.bias covers both");
  c.bias = attention_bias;
  const auto act = r.get<std::string>("hidden_act", "silu");
  ME_CHECK(act == "silu", "'", r.file, "': hidden_act is '", act, "'; LLaMA models here use silu (SwiGLU)");
  ME_CHECK(c.heads > 0 && c.hidden % c.heads == 0, "'", r.file, "': hidden_size (", c.hidden,
           ") is not divisible by num_attention_heads (", c.heads, ")");
  const auto head_dim = r.get<int64_t>("head_dim", c.hidden / c.heads);
  ME_CHECK(head_dim == c.hidden / c.heads, "'", r.file, "': head_dim is ", head_dim, ", not hidden_size / ",
           "num_attention_heads = ", c.hidden / c.heads, "; megaengine's heads are hidden / heads wide");
  return c;
}

model::TransformerConfig gpt2_from(const Reader& r) {
  auto c = model::TransformerConfig::gpt();
  c.vocab = r.get<int64_t>("vocab_size", 50257);
  c.seq = r.get<int64_t>("n_positions", 1024);
  c.hidden = r.get<int64_t>("n_embd", 768);
  c.layers = r.get<int64_t>("n_layer", 12);
  c.heads = r.get<int64_t>("n_head", 12);
  c.ffn_hidden = r.get<int64_t>("n_inner", 4 * c.hidden);
  c.norm_eps = r.get<double>("layer_norm_epsilon", 1e-5);
  c.tie_embeddings = r.get<bool>("tie_word_embeddings", true);
  c.init_std = r.get<double>("initializer_range", 0.02);
  const auto act = r.get<std::string>("activation_function", "gelu_new");
  ME_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", "'", r.file, "': activation_function is '", act,
           "'; megaengine's GPT uses the tanh GeLU (gelu_new)");
  ME_CHECK(r.get<bool>("scale_attn_weights", true) && !r.get<bool>("scale_attn_by_inverse_layer_idx", false) &&
               !r.get<bool>("add_cross_attention", false),
           "'", r.file, "': scale_attn_weights = false, scale_attn_by_inverse_layer_idx or add_cross_attention ",
           "make another attention than megaengine's GPT");
  return c;
}

}  // namespace

std::string config_json(const model::TransformerConfig& c, const std::string& dtype, int64_t bos, int64_t eos) {
  json j = family_of(c) == Family::llama ? llama_config(c) : gpt2_config(c);
  j["torch_dtype"] = dtype;
  j["bos_token_id"] = token_id(bos);
  j["eos_token_id"] = token_id(eos);
  return j.dump(2) + "\n";
}

model::TransformerConfig config_from_json(const std::string& text, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("'", file, "' is not JSON (", e.what(), ")");
  }
  ME_CHECK(j.is_object(), "'", file, "' is not a JSON object");
  const Reader r{j, file};
  const auto type = r.get<std::string>("model_type", "");
  model::TransformerConfig c;
  if (type == "llama") c = llama_from(r);
  else if (type == "gpt2") c = gpt2_from(r);
  else fail("'", file, "': model_type '", type, "' cannot be imported; megaengine reads llama and gpt2 models");
  c.validate(file);
  return c;
}

std::string dtype_from_config(const std::string& text, const std::string& file) {
  try {
    const auto j = json::parse(text);
    for (const char* key : {"torch_dtype", "dtype"})
      if (j.contains(key) && j.at(key).is_string()) return j.at(key).get<std::string>();
    return "";
  } catch (const json::exception& e) {
    fail("'", file, "' is not JSON (", e.what(), ")");
  }
}

void check_matches(const model::TransformerConfig& hf, const model::TransformerConfig& recipe, const std::string& file) {
  std::ostringstream diff;
  auto field = [&](const char* ours, const char* theirs, const auto& a, const auto& b) {
    if (a == b) return;
    diff << "\n  model." << ours << ": " << std::boolalpha << a << " in the recipe, " << b << " in config.json ("
         << theirs << ")";
  };
  auto near = [&](const char* ours, const char* theirs, double a, double b) {
    if (std::abs(a - b) > 1e-9 * std::max(std::abs(a), std::abs(b))) field(ours, theirs, a, b);
  };
  const bool llama = family_of(hf) == Family::llama;
  field("norm", "model_type", recipe.norm, hf.norm);
  field("activation", llama ? "hidden_act" : "activation_function", recipe.activation, hf.activation);
  field("position", "model_type", recipe.position, hf.position);
  field("bias", llama ? "attention_bias, mlp_bias" : "model_type", recipe.bias, hf.bias);
  field("hidden", llama ? "hidden_size" : "n_embd", recipe.hidden, hf.hidden);
  field("heads", llama ? "num_attention_heads" : "n_head", recipe.heads, hf.heads);
  field("query_groups", llama ? "num_key_value_heads" : "n_head", recipe.groups(), hf.groups());
  field("layers", llama ? "num_hidden_layers" : "n_layer", recipe.layers, hf.layers);
  field("ffn_hidden", llama ? "intermediate_size" : "n_inner", recipe.ffn(), hf.ffn());
  field("vocab", "vocab_size", recipe.vocab, hf.vocab);
  field("tie_embeddings", "tie_word_embeddings", recipe.tie_embeddings, hf.tie_embeddings);
  near("norm_eps", llama ? "rms_norm_eps" : "layer_norm_epsilon", recipe.norm_eps, hf.norm_eps);
  if (llama && recipe.position == "rope") near("rope_base", "rope_theta", recipe.rope_base, hf.rope_base);
  if (!llama && recipe.seq > hf.seq)
    diff << "\n  model.seq: " << recipe.seq << " in the recipe, more than the " << hf.seq
         << " learned positions in config.json (n_positions)";
  const auto text = diff.str();
  ME_CHECK(text.empty(), "the Hugging Face model '", file, "' does not match the recipe's model:", text,
           "\nset those model fields to config.json's values, or load the model the recipe describes");
}

}  // namespace me::hf
