// Training batches from Megatron data: the splits of one or several (blended) indexed
// datasets as GPT samples, and a loader that hands each data-parallel rank its share of every
// global batch, prefetched by a background thread.
//
// Order of samples (Megatron's MegatronPretrainingSampler): global batch b covers samples
// [consumed, consumed + global); its micro-batch m on DP rank r is the `micro` samples from
// consumed + (m x dp + r) x micro. Tensor-parallel peers have the same DP rank, so they get the
// same batches; a run restarted at consumed_samples = K sees exactly the batches it would have.
#pragma once
#include <torch/torch.h>

#include <array>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/data/gpt_dataset.h"

namespace me::data {

// The samples of one split: one GPTDataset, or a blend of several.
class GPTSamples {
 public:
  explicit GPTSamples(std::shared_ptr<const GPTDataset> one) : one_(std::move(one)) {}
  explicit GPTSamples(std::shared_ptr<const BlendedDataset> blend) : blend_(std::move(blend)) {}
  size_t size() const { return one_ ? one_->size() : blend_->size(); }
  std::vector<int64_t> sample(size_t i) const { return one_ ? one_->sample(i) : blend_->sample(i); }
  TokenOrigin origin(size_t i, size_t position) const { return one_ ? one_->origin(i, position) : blend_->origin(i, position); }

 private:
  std::shared_ptr<const GPTDataset> one_;
  std::shared_ptr<const BlendedDataset> blend_;
};

struct GPTDataConfig {
  std::vector<std::pair<double, std::string>> blend;  // {weight, prefix}; one entry for one dataset
  // A single entry is still a blend of one (Megatron's --data-path 1.0 PREFIX, where the weight
  // makes a BlendedDataset whose dataset is built 0.5% larger, which can change its epochs and
  // so its order). false: one plain dataset (--data-path PREFIX). Two or more entries: a blend.
  bool single_is_blend = false;
  std::string split = "969,30,1";                      // train, valid, test weights
  std::string cache_dir;                               // index caches; empty: next to the data
  size_t seq_length = 0;
  uint64_t seed = 1234;
};

// Train, valid and test samples for at least samples[k] samples each (a split asked for 0
// samples is not built), as Megatron-core's BlendedMegatronDatasetBuilder makes them: the same
// samples in the same order (a blend's length is blend_size(weights, samples[k])). The builder (rank 0) builds or loads every index cache; the others
// call after it with is_builder = false and only load. me::Error naming the prefix or the
// split when a dataset is missing, corrupt, or has no sequences in a split that is needed.
std::array<std::shared_ptr<const GPTSamples>, 3> build_gpt_splits(const GPTDataConfig& config,
                                                                  const std::array<size_t, 3>& samples,
                                                                  bool is_builder);

struct LoaderOptions {
  int64_t micro = 1, dp = 1, dp_rank = 0, accumulation = 1;
  int64_t consumed_samples = 0;  // where to start (resume)
  int64_t eod = -1;              // with eod_mask_loss: no loss where the input token is eod
  bool eod_mask_loss = false;
  bool pin_memory = false;  // page-locked batches, so copies to the GPU can be asynchronous
  int prefetch = 2;         // batches prepared ahead
  // The model's vocabulary: every token must be in [0, vocab_limit), checked on the host as each
  // batch is cut (on the GPU an id past the embedding is a device-side assert that kills the
  // process without a word). 0: not checked.
  int64_t vocab_limit = 0;
};

struct TokenBatch {
  torch::Tensor tokens;  // [accumulation x micro, seq] int64; rows m*micro.. are micro-batch m
  torch::Tensor labels;  // tokens shifted by one; -100 where the loss is masked
  int64_t first_sample = 0;  // consumed_samples when this batch was cut
};

// The samples at `indices` as one batch (eod >= 0: labels masked where the input is eod).
// vocab_limit > 0: me::Error if a token (input or label) is outside [0, vocab_limit), naming
// the .bin file, the document, the id and the vocabulary size, and what to do about it.
TokenBatch make_token_batch(const GPTSamples& samples, const std::vector<int64_t>& indices, bool pin_memory,
                            int64_t eod, int64_t vocab_limit = 0);

class BatchLoader {
 public:
  BatchLoader(std::shared_ptr<const GPTSamples> samples, LoaderOptions options);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // This rank's share of the next global batch. me::Error when the split runs out of samples.
  TokenBatch next();
  int64_t consumed_samples() const { return consumed_; }  // over all DP ranks
  int64_t global_batch() const { return o_.micro * o_.dp * o_.accumulation; }
  // The sample indices (into the split) of this rank's share of the global batch at `consumed`.
  std::vector<int64_t> indices(int64_t consumed) const;

 private:
  TokenBatch make(int64_t consumed) const;
  void prefetch_loop();

  std::shared_ptr<const GPTSamples> samples_;
  LoaderOptions o_;
  int64_t consumed_ = 0;  // handed out
  int64_t planned_ = 0;   // prepared by the thread
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<TokenBatch, std::string>> ready_;  // batch, or the error making it
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace me::data
