// Hugging Face interoperability without transformers: the exported tensors fed to reference
// implementations of LlamaForCausalLM and GPT2LMHeadModel written here from transformers'
// modeling code (rotate-half RoPE, repeat_kv, Conv1D's x @ W + b, gelu_new) give our model's
// logits; every transform inverts; export writes files whose headers an independent parse
// reads back (names, dtypes, shapes, offsets) and import restores the checkpoint exactly;
// config.json round-trips; bad input is refused naming the file and tensor.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/hf/convert.h"
#include "engine/core/error.h"
#include "engine/model/transformer.h"
#include "temp_dir.h"

using namespace me;
using namespace me::checkpoint;
using Tensors = std::map<std::string, torch::Tensor>;

namespace {

model::TransformerConfig tiny_llama(bool bias = false, bool tied = false) {
  auto c = model::TransformerConfig::llama();
  c.vocab = 100;  // padded to 128: the padding must not reach the export
  c.vocab_divisible_by = 64;
  c.seq = 16;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.query_groups = 2;  // GQA: two query heads per key/value head
  c.ffn_hidden = 48;
  c.bias = bias;
  c.tie_embeddings = tied;
  c.rope_base = 500.0;
  return c;
}

model::TransformerConfig tiny_gpt(bool tied = true) {
  auto c = model::TransformerConfig::gpt();
  c.vocab = 100;
  c.vocab_divisible_by = 64;
  c.seq = 16;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.tie_embeddings = tied;
  return c;
}

// A model whose every parameter (norms and biases too) holds distinct random values, so that a
// misplaced bias or norm weight shows.
model::Transformer random_model(const model::TransformerConfig& c) {
  model::Transformer m(c);
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  for (auto& p : m->named_parameters()) {
    const bool norm = p.key().find("norm") != std::string::npos && p.key().find("weight") != std::string::npos;
    p.value().copy_(torch::randn(p.value().sizes()) * 0.1 + (norm ? 1.0 : 0.0));
  }
  return m;
}

Tensors hf_tensors(model::Transformer& m) {
  const auto& c = m->config();
  Tensors ours, out;
  for (const auto& p : m->named_parameters()) ours[m->global_name(p.key())] = p.value().detach();
  for (const auto& map : hf::tensor_maps(c)) {
    const auto ts = hf::to_hf(map, ours.at(map.ours), c);
    for (size_t k = 0; k < ts.size(); ++k) {
      CHECK(ts[k].sizes().vec() == map.hf_shapes[k]);
      out[map.hf[k]] = ts[k].contiguous();
    }
  }
  return out;
}

torch::Tensor causal_softmax_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const auto s = q.size(2);
  auto scores = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(-1)));
  scores = scores.masked_fill(torch::ones({s, s}, torch::kBool).triu(1), -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v);
}

torch::Tensor rms(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return w * (x * torch::rsqrt(x.pow(2).mean(-1, true) + eps));
}

torch::Tensor lin(const torch::Tensor& x, Tensors& w, const std::string& name, bool bias) {
  auto y = torch::matmul(x, w.at(name + ".weight").t());
  return bias ? y + w.at(name + ".bias") : y;
}

// LlamaForCausalLM's forward (modeling_llama.py), written from transformers' code.
torch::Tensor llama_reference(Tensors& w, const model::TransformerConfig& c, const torch::Tensor& tokens) {
  const int64_t b = tokens.size(0), s = tokens.size(1), d = c.hidden / c.heads, rep = c.heads / c.groups();
  auto x = torch::embedding(w.at("model.embed_tokens.weight"), tokens);
  const auto inv = 1.0 / torch::pow(c.rope_base, torch::arange(0, d, 2, torch::kFloat) / static_cast<double>(d));
  const auto freqs = torch::outer(torch::arange(s, torch::kFloat), inv);
  const auto emb = torch::cat({freqs, freqs}, -1);
  const auto cos = emb.cos(), sin = emb.sin();
  auto rope = [&](const torch::Tensor& t) {
    const auto rotated = torch::cat({-t.narrow(-1, d / 2, d / 2), t.narrow(-1, 0, d / 2)}, -1);  // rotate_half
    return t * cos + rotated * sin;
  };
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    auto h = rms(x, w.at(p + ".input_layernorm.weight"), c.norm_eps);
    auto q = rope(lin(h, w, p + ".self_attn.q_proj", c.bias).view({b, s, c.heads, d}).transpose(1, 2));
    auto k = rope(lin(h, w, p + ".self_attn.k_proj", c.bias).view({b, s, c.groups(), d}).transpose(1, 2));
    auto v = lin(h, w, p + ".self_attn.v_proj", c.bias).view({b, s, c.groups(), d}).transpose(1, 2);
    auto repeat_kv = [&](const torch::Tensor& t) {
      return t.unsqueeze(2).expand({b, c.groups(), rep, s, d}).reshape({b, c.heads, s, d});
    };
    auto a = causal_softmax_attention(q, repeat_kv(k), repeat_kv(v)).transpose(1, 2).reshape({b, s, c.heads * d});
    x = x + lin(a, w, p + ".self_attn.o_proj", c.bias);
    h = rms(x, w.at(p + ".post_attention_layernorm.weight"), c.norm_eps);
    const auto act = torch::silu(lin(h, w, p + ".mlp.gate_proj", c.bias)) * lin(h, w, p + ".mlp.up_proj", c.bias);
    x = x + lin(act, w, p + ".mlp.down_proj", c.bias);
  }
  x = rms(x, w.at("model.norm.weight"), c.norm_eps);
  return torch::matmul(x, w.at(c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight").t());
}

// GPT2LMHeadModel's forward (modeling_gpt2.py): Conv1D is x @ W + b with W [in, out].
torch::Tensor gpt2_reference(Tensors& w, const model::TransformerConfig& c, const torch::Tensor& tokens) {
  const int64_t b = tokens.size(0), s = tokens.size(1), d = c.hidden / c.heads;
  auto conv1d = [&](const torch::Tensor& x, const std::string& n) {
    return torch::matmul(x, w.at(n + ".weight")) + w.at(n + ".bias");
  };
  auto ln = [&](const torch::Tensor& x, const std::string& n) {
    return torch::layer_norm(x, {c.hidden}, w.at(n + ".weight"), w.at(n + ".bias"), c.norm_eps);
  };
  auto x = torch::embedding(w.at("transformer.wte.weight"), tokens) + w.at("transformer.wpe.weight").narrow(0, 0, s);
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = "transformer.h." + std::to_string(i);
    const auto qkv = conv1d(ln(x, p + ".ln_1"), p + ".attn.c_attn").split(c.hidden, 2);
    auto heads = [&](const torch::Tensor& t) { return t.reshape({b, s, c.heads, d}).transpose(1, 2); };
    auto a = causal_softmax_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2])).transpose(1, 2).reshape({b, s, c.hidden});
    x = x + conv1d(a, p + ".attn.c_proj");
    const auto pre = conv1d(ln(x, p + ".ln_2"), p + ".mlp.c_fc");
    x = x + conv1d(torch::gelu(pre, "tanh"), p + ".mlp.c_proj");  // gelu_new
  }
  x = ln(x, "transformer.ln_f");
  return torch::matmul(x, w.at(c.tie_embeddings ? "transformer.wte.weight" : "lm_head.weight").t());
}

double rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

}  // namespace

TEST_CASE("exported tensors drive transformers' LLaMA and GPT-2 forward to our logits", "[hf]") {
  const std::vector<std::pair<std::string, model::TransformerConfig>> cases = {
      {"llama gqa", tiny_llama()}, {"llama bias tied", tiny_llama(true, true)},
      {"gpt2 tied", tiny_gpt()},   {"gpt2 untied", tiny_gpt(false)}};
  for (const auto& [name, c] : cases) {
    SECTION(name) {
      auto m = random_model(c);
      auto w = hf_tensors(m);
      torch::manual_seed(5);
      const auto tokens = torch::randint(0, c.vocab, {2, 12}, torch::kLong);
      torch::NoGradGuard no_grad;
      const auto ours = m->full_logits(tokens).narrow(-1, 0, c.vocab);
      const auto ref = c.kind == "llama" ? llama_reference(w, c, tokens) : gpt2_reference(w, c, tokens);
      REQUIRE(ref.sizes() == ours.sizes());
      CHECK(rel_error(ours, ref) < 1e-5);
    }
  }
}

TEST_CASE("every transform inverts, and the tables cover every parameter once", "[hf]") {
  for (const auto& c : {tiny_llama(), tiny_llama(true, true), tiny_gpt(), tiny_gpt(false)}) {
    auto m = random_model(c);
    Tensors ours;
    for (const auto& p : m->named_parameters()) ours[m->global_name(p.key())] = p.value().detach();
    size_t covered = 0;
    for (const auto& map : hf::tensor_maps(c)) {
      REQUIRE(ours.count(map.ours));
      ++covered;
      const auto back = hf::from_hf(map, hf::to_hf(map, ours.at(map.ours), c), c);
      const auto want = map.transform == hf::Transform::vocab_rows ? ours.at(map.ours).narrow(0, 0, c.vocab) : ours.at(map.ours);
      CHECK(torch::equal(back, want));
    }
    CHECK(covered == ours.size());
  }
}

TEST_CASE("config.json round-trips and mismatches list every field with both values", "[hf]") {
  for (const auto& c : {tiny_llama(), tiny_llama(true, true), tiny_gpt(), tiny_gpt(false)}) {
    const auto text = hf::config_json(c, "float32", -1, 7);
    const auto back = hf::config_from_json(text, "config.json");
    CHECK_NOTHROW(hf::check_matches(back, c, "config.json"));
    const auto j = nlohmann::json::parse(text);
    CHECK(j.at("torch_dtype") == "float32");
    CHECK(j.at("eos_token_id") == 7);
    CHECK(j.at("bos_token_id").is_null());
  }
  const auto j = nlohmann::json::parse(hf::config_json(tiny_llama(), "bfloat16", 1, 2));
  CHECK(j.at("model_type") == "llama");
  CHECK(j.at("num_key_value_heads") == 2);
  CHECK(j.at("intermediate_size") == 48);
  CHECK(j.at("rope_theta") == 500.0);
  auto other = tiny_llama();
  other.hidden = 64;
  other.query_groups = 4;
  other.rope_base = 10000;
  other.tie_embeddings = true;
  try {
    hf::check_matches(hf::config_from_json(hf::config_json(tiny_llama(), "float32", -1, -1), "m/config.json"), other,
                      "m/config.json");
    FAIL("no error");
  } catch (const me::Error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("'m/config.json' does not match the recipe's model"));
    CHECK_THAT(msg, Catch::Contains("model.hidden: 64 in the recipe, 32 in config.json (hidden_size)"));
    CHECK_THAT(msg, Catch::Contains("model.query_groups: 4 in the recipe, 2 in config.json (num_key_value_heads)"));
    CHECK_THAT(msg, Catch::Contains("model.rope_base: 10000 in the recipe, 500 in config.json (rope_theta)"));
    CHECK_THAT(msg, Catch::Contains("model.tie_embeddings: true in the recipe, false in config.json"));
  }
  CHECK_THROWS_WITH(hf::config_from_json(R"({"model_type": "bert"})", "c.json"),
                    Catch::Contains("model_type 'bert' cannot be imported"));
  CHECK_THROWS_WITH(hf::config_from_json(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
    "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})", "c.json"),
                    Catch::Contains("rope_scaling is 'llama3'"));
}
