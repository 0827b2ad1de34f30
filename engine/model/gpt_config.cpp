#include "engine/model/gpt_config.h"

#include "engine/core/error.h"

namespace me::model {

void GPTConfig::validate(const std::string& where) const {
  auto positive = [&](const char* name, int64_t v) {
    ME_CHECK(v > 0, where, ".", name, " must be a positive integer, got ", v);
  };
  positive("vocab", vocab);
  positive("seq", seq);
  positive("layers", layers);
  positive("hidden", hidden);
  positive("heads", heads);
  ME_CHECK(ffn_hidden >= 0, where, ".ffn_hidden must be a positive integer (or 0 for 4*hidden), got ", ffn_hidden);
  ME_CHECK(hidden % heads == 0, where, ".hidden (", hidden, ") must be divisible by ", where, ".heads (", heads, ")");
  ME_CHECK(init_std > 0, where, ".init_std must be positive, got ", init_std);
}

int64_t GPTConfig::parameter_count() const {
  const int64_t h = hidden, f = ffn();
  const int64_t per_layer = 4 * h * h + 2 * h * f + 9 * h + f;
  int64_t n = vocab * h + seq * h + layers * per_layer + 2 * h;
  if (!tie_embeddings) n += vocab * h;
  return n;
}

std::string GPTConfig::describe() const {
  return cat("GPT(layers=", layers, ", hidden=", hidden, ", heads=", heads, ", ffn=", ffn(), ", seq=", seq,
             ", vocab=", vocab, tie_embeddings ? ", tied" : ", untied", ")");
}

}  // namespace me::model
