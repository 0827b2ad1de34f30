// SentencePiece tokenizers (LLaMA's tokenizer.model and any model from spm_train), through Debian's
// libsentencepiece, loaded at run time from libme_sentencepiece.so (see sentencepiece_plugin.cpp for why).
// Only in builds where it was found (ME_HAVE_SENTENCEPIECE); sentencepiece's
// header stays in the .cpp, so code that includes this one needs nothing but the library to link.
//
// encode: SentencePieceProcessor::Encode, so the ids are exactly those of spm_encode and of
// sentencepiece's Python module (no bos/eos added: preprocessing appends eod() itself).
// The model's normalizer runs first: with the default nmt_nfkc rule, text is NFKC-normalised and
// extra whitespace dropped, so decode(encode(x)) == x only for text the rule leaves alone; models
// trained with --normalization_rule_name=identity --remove_extra_whitespaces=false (LLaMA's) keep
// every valid UTF-8 string except one holding U+2581 ("▁", which decodes as a space). Invalid
// UTF-8 becomes U+FFFD in any model.
//
// encode is const and thread-safe: sentencepiece's Encode is const and keeps its scratch state on
// the stack; its maintainers support concurrent calls on one processor (google/sentencepiece#207, #657).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/tokenizer.h"

namespace me::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Loads a serialized SentencePiece model (tokenizer.model). Throws me::Error naming the file
  // when it is missing, not a SentencePiece model, or has no end-of-sentence piece (eod needs one).
  explicit SentencePieceTokenizer(const std::string& model_file);
  ~SentencePieceTokenizer();
  SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  using Tokenizer::encode;
  void encode_into(const std::string& text, std::vector<int64_t>& out) const override;

  // sentencepiece's detokenisation: pieces joined, "▁" back to spaces, the dummy prefix space
  // dropped, byte pieces reassembled, control ids (<s>, </s>) as nothing. Throws me::Error on an
  // id out of range (checked here: sentencepiece itself would not).
  std::string decode(const std::vector<int64_t>& ids) const override;

  int64_t vocab_size() const override;  // GetPieceSize(): 32000 for LLaMA
  int64_t eod() const override;         // eos_id(): "</s>", 2 for LLaMA
  std::string describe() const override;  // "sentencepiece (32000 ids, eod 2) from <path>"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace me::data
