// Where the trainer's batches come from, whatever the data kind: byte-level text (windows at
// random offsets, drawn from the shared seed) or Megatron .bin/.idx datasets through the
// prefetching BatchLoader; plus the tokenizer that turns prompts and samples into text.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/data/byte_text.h"
#include "engine/data/gpt_loader.h"
#include "engine/config/recipe.h"

namespace me::train {

struct DataLayout {
  int64_t global_batch = 1, micro = 1, dp = 1, dp_rank = 0, accumulation = 1, iters = 1;
  int64_t consumed_samples = 0;  // where a resumed run starts
  bool pin_memory = false;
};

// data.tokenizer loaded (nullptr when the spec names none). me::Error if this build has no
// tokenizers (libpcre2-dev / nlohmann-json3-dev were missing at configure time).
std::unique_ptr<data::Tokenizer> load_tokenizer(const data::TokenizerSpec& spec);

// What a me.data.gpt{} spec means to the sample-index builder, for samples of seq + 1 tokens.
data::GPTDataConfig gpt_data_config(const config::DataSpec& spec, int64_t seq, uint64_t seed);

// data.eod_mask_loss into loader options: the end-of-document id comes from the tokenizer
// (me::Error naming data.tokenizer when there is none).
void set_eod_mask(const config::DataSpec& spec, const data::Tokenizer* tokenizer, data::LoaderOptions& options);

class TrainData {
 public:
  // Rank 0 preprocesses data.source if asked and builds the index caches; the other ranks
  // wait for it on the world group of `comm` (nullptr: a single process) and then load them.
  // Every batch of .bin/.idx data is checked on the host against spec.model.vocab as it is cut:
  // a token id outside it is a me::Error naming the .bin file, the document, the id and the
  // vocabulary (data::LoaderOptions::vocab_limit).
  TrainData(const config::Recipe& spec, comm::Communicator* comm, DataLayout layout);
  ~TrainData();

  // This rank's share of the next global batch: [accumulation x micro, seq] tokens and labels.
  data::TokenBatch next_train();
  // Validation batch i (i < eval_iters) of `micro` samples: the same on every rank and every call.
  data::TokenBatch valid_batch(int64_t i);
  int64_t consumed_samples() const;

  int64_t vocab() const;  // ids the data may contain: the tokenizer's, 256 for bytes, 0: unknown
  bool can_decode() const { return kind_ == "text" || tokenizer_ != nullptr; }
  std::vector<int64_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int64_t>& ids) const;
  std::string describe() const;

 private:
  std::string kind_;
  DataLayout layout_;
  std::mt19937_64 rng_;  // text: the shared seed every rank draws whole global batches from
  uint64_t seed_;
  int64_t vocab_limit_;  // the model's vocabulary: token ids of the batches must be below it
  std::unique_ptr<data::ByteTextDataset> text_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::unique_ptr<data::BatchLoader> loader_;
  std::shared_ptr<const data::GPTSamples> valid_;
  std::string description_;
  int64_t text_consumed_ = 0;
};

}  // namespace me::train
