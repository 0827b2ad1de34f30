#include "engine/data/tokenizer.h"

#include "engine/core/error.h"
#include "engine/data/gpt2_tokenizer.h"
#ifdef ME_HAVE_SENTENCEPIECE
#include "engine/data/sentencepiece_tokenizer.h"
#endif

namespace me::data {

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerSpec& spec) {
  if (spec.kind == "gpt2") {
    ME_CHECK(!spec.vocab_file.empty(), "tokenizer.kind = 'gpt2' needs tokenizer.vocab_file ",
             "(GPT-2's encoder.json, Megatron's --vocab-file)");
    ME_CHECK(!spec.merge_file.empty(), "tokenizer.kind = 'gpt2' needs tokenizer.merge_file ",
             "(GPT-2's vocab.bpe or merges.txt, Megatron's --merge-file)");
    return std::make_unique<GPT2Tokenizer>(spec.vocab_file, spec.merge_file);
  }
  if (spec.kind == "sentencepiece") {
#ifdef ME_HAVE_SENTENCEPIECE
    ME_CHECK(!spec.model_file.empty(), "tokenizer.kind = 'sentencepiece' needs tokenizer.model_file ",
             "(the tokenizer.model from spm_train or LLaMA, Megatron's --tokenizer-model)");
    return std::make_unique<SentencePieceTokenizer>(spec.model_file);
#else
    fail("tokenizer.kind = 'sentencepiece': this megaengine was built without libsentencepiece-dev; ",
         "install it (apt-get install libsentencepiece-dev, or run scripts/setup.sh), then re-run cmake and rebuild");
#endif
  }
  fail("unknown tokenizer.kind '", spec.kind, "'; valid kinds: gpt2, sentencepiece");
}

}  // namespace me::data
