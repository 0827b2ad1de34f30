// GPT-2's byte-level BPE tokenizer (OpenAI's encoder.json + vocab.bpe, "r50k_base"), in plain
// C++17 with PCRE2 for the pre-tokenizer regex. No LibTorch, no Lua: preprocessing tools link it alone.
//
// encode: the text is split by GPT-2's regex (contractions, letter runs, number runs, other-symbol
// runs, each with at most one leading space, and whitespace runs), every piece is mapped to bytes,
// and the merges of vocab.bpe are applied to each piece lowest rank first, exactly as OpenAI's
// encoder.py does. Text is taken as UTF-8; bytes that are not valid UTF-8 (which GPT-2 never sees,
// as Python strings are always valid) match no regex class and are encoded as pieces of their own,
// so decode_bytes(encode(x)) == x holds for any byte string (decode(encode(x)) == x for valid UTF-8).
// "<|endoftext|>" in the text is plain text, as in GPT-2; eod() is the id to append between documents.
//
// encode is const and thread-safe: several threads may encode with one tokenizer (each thread keeps
// its own cache of already-encoded pieces, so they never wait on each other).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/tokenizer.h"

namespace me::data {

class GPT2Tokenizer final : public Tokenizer {
 public:
  // Reads GPT-2's encoder.json (token -> id) and vocab.bpe (merges, in rank order). Throws
  // me::Error naming the file when one is missing, unreadable or malformed.
  GPT2Tokenizer(const std::string& encoder_json, const std::string& vocab_bpe);
  ~GPT2Tokenizer();
  GPT2Tokenizer(GPT2Tokenizer&&) noexcept;
  GPT2Tokenizer& operator=(GPT2Tokenizer&&) noexcept;
  GPT2Tokenizer(const GPT2Tokenizer&) = delete;
  GPT2Tokenizer& operator=(const GPT2Tokenizer&) = delete;

  using Tokenizer::encode;
  // Appends the ids of `text` to `out` (saves a copy when building long token streams).
  void encode_into(const std::string& text, std::vector<int64_t>& out) const override;

  // The text of the ids, always valid UTF-8: a character split between tokens, or any other
  // ill-formed byte sequence, becomes U+FFFD as in Hugging Face tokenizers' decode (utf8.h).
  // Throws me::Error on an id out of range.
  std::string decode(const std::vector<int64_t>& ids) const override;
  // The bytes the ids stand for, concatenated, unrepaired: decode_bytes(encode(x)) == x for any
  // byte string x, valid UTF-8 or not.
  std::string decode_bytes(const std::vector<int64_t>& ids) const;

  int64_t vocab_size() const override;  // 50257 for GPT-2
  int64_t eod() const override;         // id of "<|endoftext|>", 50256 for GPT-2
  std::string describe() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace me::data
