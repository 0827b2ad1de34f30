// What preprocessing, the loader and sampling need from a tokenizer: text -> ids, ids -> text,
// the vocabulary size and the end-of-document id. GPT2Tokenizer (byte-level BPE) and
// SentencePieceTokenizer implement it. No LibTorch.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace me::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Appends the ids of `text` to `out`. Must be safe to call from several threads at once.
  virtual void encode_into(const std::string& text, std::vector<int64_t>& out) const = 0;
  std::vector<int64_t> encode(const std::string& text) const {
    std::vector<int64_t> out;
    encode_into(text, out);
    return out;
  }
  // Always valid UTF-8 (ill-formed byte sequences become U+FFFD, engine/core/utf8.h), so samples
  // and logs can be printed as they are. Throws me::Error on an id out of range.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t eod() const = 0;  // appended after each document by preprocessing
  virtual std::string describe() const = 0;  // "gpt2 (50257 ids, eod 50256)"
};

// Which tokenizer and its files, as a recipe or the preprocess command names them.
struct TokenizerSpec {
  std::string kind;        // gpt2 | sentencepiece
  std::string vocab_file;  // gpt2: encoder.json (Megatron's --vocab-file)
  std::string merge_file;  // gpt2: vocab.bpe / merges.txt (--merge-file)
  std::string model_file;  // sentencepiece: tokenizer.model (--tokenizer-model)
};

// me::Error naming the field when the kind is unknown, a file is missing, or the kind was not
// built in (the library it needs was not found at configure time).
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerSpec& spec);

}  // namespace me::data
