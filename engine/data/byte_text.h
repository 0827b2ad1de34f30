// Byte-level text data for the walking skeleton: a UTF-8 file read as bytes (vocabulary 256),
// the last `holdout` fraction kept aside for validation. The indexed .bin/.idx pipeline with
// real tokenizers replaces this as the default (data issue); this stays as the no-setup path.
#pragma once
#include <torch/torch.h>

#include <random>
#include <string>
#include <vector>

namespace me::data {

struct Batch {
  torch::Tensor tokens;  // [batch, seq] int64
  torch::Tensor labels;  // [batch, seq] int64, tokens shifted by one
};

class ByteTextDataset {
 public:
  // Throws me::Error naming the file when it is missing, unreadable or too short.
  ByteTextDataset(const std::string& path, double holdout, int64_t seq);

  static constexpr int64_t vocab() { return 256; }
  int64_t train_tokens() const { return train_.numel(); }
  int64_t valid_tokens() const { return valid_.numel(); }

  // `batch` windows of seq+1 bytes at offsets drawn from `rng`.
  Batch sample(bool validation, int64_t batch, std::mt19937_64& rng) const;

  static std::vector<int64_t> encode(const std::string& text);
  // The bytes as text, valid UTF-8: a model's ill-formed byte sequences become U+FFFD (utf8.h).
  static std::string decode(const std::vector<int64_t>& tokens);

 private:
  torch::Tensor train_, valid_;
  int64_t seq_;
};

}  // namespace me::data
