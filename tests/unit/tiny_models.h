// Tiny GPT and LLaMA models for the unit tests, and a model with its main-grad buffer.
#pragma once
#include <torch/torch.h>

#include <memory>

#include "engine/model/transformer.h"
#include "engine/parallel/grad_buffer.h"
#include "engine/parallel/layers.h"

namespace me::test {

// The family `c` at the tests' size: vocab 97, seq 24, hidden 32, 4 heads, `layers` layers.
inline model::TransformerConfig tiny_of(model::TransformerConfig c, int64_t layers) {
  c.vocab = 97;
  c.vocab_divisible_by = 1;
  c.seq = 24;
  c.layers = layers;
  c.hidden = 32;
  c.heads = 4;
  return c;
}

inline model::TransformerConfig tiny_gpt() { return tiny_of(model::TransformerConfig::gpt(), 3); }

inline model::TransformerConfig tiny_llama() {
  auto c = tiny_of(model::TransformerConfig::llama(), 2);
  c.query_groups = 2;
  c.ffn_multiple_of = 16;
  return c;
}

// A model of `c` drawn from `seed` on `device` in `dtype`, with a main-grad buffer over its
// parameters that its linear layers write into when `fused` (gradient-accumulation fusion).
struct ModelWithGrads {
  model::Transformer model;
  std::unique_ptr<parallel::GradBuffer> grads;
  ModelWithGrads(const model::TransformerConfig& c, uint64_t seed, const torch::Device& device, torch::ScalarType dtype,
                 bool fused)
      : model(c) {
    model->reset_parameters(seed);
    model->to(device, dtype);
    grads = std::make_unique<parallel::GradBuffer>(model->parameters(), nullptr, 25.0, false);
    if (fused) parallel::attach_main_grads(*model, grads.get());
  }
};

}  // namespace me::test
