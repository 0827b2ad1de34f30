#include <catch2/catch.hpp>

#include <cmath>

#include "engine/model/gpt.h"

using me::model::GPT;
using me::model::GPTConfig;

namespace {
GPTConfig tiny() {
  GPTConfig c;
  c.vocab = 97;
  c.seq = 24;
  c.layers = 3;
  c.hidden = 32;
  c.heads = 4;
  return c;
}
}  // namespace

TEST_CASE("GPT parameter count: the formula equals the module", "[model]") {
  for (bool tied : {true, false}) {
    for (int64_t ffn : {int64_t{0}, int64_t{50}}) {
      auto c = tiny();
      c.tie_embeddings = tied;
      c.ffn_hidden = ffn;
      GPT m(c);
      CHECK(m->parameter_count() == c.parameter_count());
    }
  }
  auto c = tiny();
  const int64_t h = 32, f = 128, L = 3, V = 97, S = 24;
  CHECK(c.parameter_count() == V * h + S * h + L * (4 * h * h + 2 * h * f + 9 * h + f) + 2 * h);
}

TEST_CASE("GPT forward shapes and the initial loss", "[model]") {
  GPT m(tiny());
  m->reset_parameters(3);
  auto tokens = torch::randint(0, 97, {2, 24}, torch::kLong);
  auto logits = m->forward(tokens);
  REQUIRE(logits.sizes() == torch::IntArrayRef({2, 24, 97}));
  // Small init: predictions start near uniform, loss near ln(vocab).
  const double loss = m->loss(tokens, torch::randint(0, 97, {2, 24}, torch::kLong)).item<double>();
  CHECK(std::abs(loss - std::log(97.0)) < 0.3);
  // Shorter sequences are fine; longer ones are a clear error.
  CHECK(m->forward(tokens.narrow(1, 0, 5)).size(1) == 5);
  CHECK_THROWS_WITH(m->forward(torch::zeros({1, 25}, torch::kLong)), Catch::Contains("longer than model.seq = 24"));
}

TEST_CASE("GPT attention is causal: a later token does not change earlier logits", "[model]") {
  GPT m(tiny());
  m->reset_parameters(5);
  auto a = torch::randint(0, 97, {1, 10}, torch::kLong);
  auto b = a.clone();
  b[0][9] = (a[0][9].item<int64_t>() + 1) % 97;
  auto la = m->forward(a), lb = m->forward(b);
  CHECK(torch::allclose(la.narrow(1, 0, 9), lb.narrow(1, 0, 9), 1e-5, 1e-6));
  CHECK_FALSE(torch::allclose(la.narrow(1, 9, 1), lb.narrow(1, 9, 1)));
}

TEST_CASE("GPT init depends on the seed alone", "[model]") {
  GPT a(tiny()), b(tiny()), c(tiny());
  a->reset_parameters(11);
  b->reset_parameters(11);
  c->reset_parameters(12);
  auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  bool all_equal = true, any_differs = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    all_equal = all_equal && torch::equal(pa[i], pb[i]);
    any_differs = any_differs || !torch::equal(pa[i], pc[i]);
  }
  CHECK(all_equal);
  CHECK(any_differs);
  // LayerNorm weights start at one, biases at zero.
  for (const auto& p : a->named_parameters()) {
    if (p.key().find("ln") != std::string::npos && p.key().find("weight") != std::string::npos)
      CHECK(p.value().eq(1).all().item<bool>());
    if (p.key().find("bias") != std::string::npos) CHECK(p.value().eq(0).all().item<bool>());
  }
}

TEST_CASE("GPT config validation names the field", "[model]") {
  auto c = tiny();
  c.hidden = 0;
  CHECK_THROWS_WITH(c.validate(), "model.hidden must be a positive integer, got 0");
  c = tiny();
  c.layers = -1;
  CHECK_THROWS_WITH(c.validate(), "model.layers must be a positive integer, got -1");
  c = tiny();
  c.heads = 5;
  CHECK_THROWS_WITH(c.validate(), "model.hidden (32) must be divisible by model.heads (5)");
}

TEST_CASE("generate extends the prompt and is deterministic for a seed", "[model]") {
  GPT m(tiny());
  auto a = me::model::generate(m, {1, 2, 3}, 10, 5, 1.0, 42);
  auto b = me::model::generate(m, {1, 2, 3}, 10, 5, 1.0, 42);
  REQUIRE(a.size() == 13);
  CHECK(a == b);
  for (auto t : a) CHECK((t >= 0 && t < 97));
}
