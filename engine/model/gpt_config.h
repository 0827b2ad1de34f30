// What defines a GPT, as plain data (no LibTorch here: the Lua bindings and the CLI read
// and validate it without paying for torch's headers).
#pragma once
#include <cstdint>
#include <string>

namespace me::model {

struct GPTConfig {
  int64_t vocab = 256;       // vocabulary the tokenizer produces
  int64_t seq = 128;         // context length (learned position embeddings of this size)
  int64_t layers = 4;
  int64_t hidden = 128;
  int64_t heads = 4;
  int64_t ffn_hidden = 0;    // 0 means Megatron's default, 4 * hidden
  double init_std = 0.02;    // normal init of weights; output projections scaled by 1/sqrt(2*layers)
  bool tie_embeddings = true;

  int64_t ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * hidden; }
  int64_t head_dim() const { return hidden / heads; }

  // Throws me::Error naming the field ("model.hidden must be a positive integer, got 0").
  void validate(const std::string& where = "model") const;

  // Exact parameter count of the module GPT builds, from the formula (tested against it):
  // embeddings V*h + S*h; per layer 4h^2 + 2hf + 9h + f (qkv, proj, fc1, fc2, two norms);
  // final norm 2h; an untied head adds V*h.
  int64_t parameter_count() const;

  std::string describe() const;
};

}  // namespace me::model
