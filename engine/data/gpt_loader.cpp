#include "engine/data/gpt_loader.h"

#include "engine/core/error.h"

namespace me::data {

std::array<std::shared_ptr<const GPTSamples>, 3> build_gpt_splits(const GPTDataConfig& c,
                                                                  const std::array<size_t, 3>& samples,
                                                                  bool is_builder) {
  static const char* kSplitNames[3] = {"train", "valid", "test"};
  ME_CHECK(!c.blend.empty(), "data: no dataset given: set data.prefix, or data.blend = { {weight, prefix}, ... }");
  ME_CHECK(c.seq_length > 0, "data: seq_length must be positive");
  std::vector<std::shared_ptr<const IndexedDataset>> data;
  std::vector<double> weights;
  for (const auto& [w, prefix] : c.blend) {
    data.push_back(std::make_shared<const IndexedDataset>(prefix));
    weights.push_back(w);
  }
  std::array<std::shared_ptr<const GPTSamples>, 3> out;
  for (size_t k = 0; k < 3; ++k) {
    if (samples[k] == 0) continue;
    // Each dataset of a blend gives its share (Megatron's 0.5% surplus included).
    const bool blended = data.size() > 1 || c.single_is_blend;
    const auto needed = blended ? blend_samples_needed(weights, samples[k]) : std::vector<size_t>{samples[k]};
    std::vector<std::shared_ptr<const GPTDataset>> parts;
    for (size_t d = 0; d < data.size(); ++d) {
      const auto range = split_documents(c.split, data[d]->size())[k];
      ME_CHECK(range.second > range.first, "data: the ", kSplitNames[k], " split of '", data[d]->prefix(),
               "' is empty under data.split = \"", c.split, "\" (", data[d]->size(), " sequences); give it a share ",
               k == 1 ? "(or set train.eval_iters = 0)" : "");
      GPTDatasetConfig g;
      g.seq_length = c.seq_length;
      g.num_samples = needed[d];
      g.seed = c.seed;
      g.cache_dir = c.cache_dir;
      parts.push_back(std::make_shared<const GPTDataset>(GPTDataset::build_or_load(data[d], range, g, is_builder)));
    }
    out[k] = !blended ? std::make_shared<const GPTSamples>(parts[0])
                      : std::make_shared<const GPTSamples>(std::make_shared<const BlendedDataset>(
                            parts, weights, blend_size(weights, samples[k])));
  }
  return out;
}

BatchLoader::BatchLoader(std::shared_ptr<const GPTSamples> samples, LoaderOptions options)
    : samples_(std::move(samples)), o_(options), consumed_(options.consumed_samples), planned_(options.consumed_samples) {
  ME_CHECK(samples_ != nullptr, "loader: no samples");
  ME_CHECK(o_.micro > 0 && o_.dp > 0 && o_.accumulation > 0 && o_.dp_rank >= 0 && o_.dp_rank < o_.dp,
           "loader: bad batch layout (micro ", o_.micro, ", dp rank ", o_.dp_rank, " of ", o_.dp, ", accumulation ",
           o_.accumulation, ")");
  ME_CHECK(o_.consumed_samples >= 0, "loader: consumed_samples must be >= 0, got ", o_.consumed_samples);
  if (o_.prefetch > 0) thread_ = std::thread([this] { prefetch_loop(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> g(m_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<int64_t> BatchLoader::indices(int64_t consumed) const {
  std::vector<int64_t> idx;
  for (int64_t m = 0; m < o_.accumulation; ++m)
    for (int64_t j = 0; j < o_.micro; ++j) idx.push_back(consumed + (m * o_.dp + o_.dp_rank) * o_.micro + j);
  return idx;
}

namespace {

// One pass over the sample (tokens are in cache from the copy); the origin is looked up only
// when there is something to report.
void check_vocab(const GPTSamples& samples, int64_t index, const std::vector<int64_t>& s, int64_t vocab_limit) {
  for (size_t p = 0; p < s.size(); ++p) {
    if (static_cast<uint64_t>(s[p]) < static_cast<uint64_t>(vocab_limit)) continue;
    const auto o = samples.origin(static_cast<size_t>(index), p);
    fail("data: token id ", s[p], " in '", o.bin_path, "' (document ", o.document, ", sequence ", o.sequence,
         ", token ", o.offset, "; sample ", index, ") is outside the model's vocabulary of ", vocab_limit,
         " ids (model.vocab). The data was tokenized with another tokenizer than the model's: preprocess it again ",
         "with the model's tokenizer (megaengine preprocess), or, if the model is meant for that tokenizer, set ",
         "model.vocab to its vocabulary size", s[p] >= vocab_limit ? cat(" (at least ", s[p] + 1, ")") : "");
  }
}

}  // namespace

TokenBatch make_token_batch(const GPTSamples& samples, const std::vector<int64_t>& idx, bool pin_memory, int64_t eod,
                            int64_t vocab_limit) {
  ME_CHECK(!idx.empty(), "make_token_batch: no samples asked for");
  for (int64_t i : idx)
    ME_CHECK(i >= 0 && static_cast<size_t>(i) < samples.size(), "data: sample ", i, " asked for, but the split has ",
             samples.size(), " samples");
  auto first = samples.sample(static_cast<size_t>(idx[0]));
  const int64_t rows = static_cast<int64_t>(idx.size()), seq = static_cast<int64_t>(first.size()) - 1;
  auto opts = torch::TensorOptions().dtype(torch::kLong).pinned_memory(pin_memory);
  auto tokens = torch::empty({rows, seq}, opts), labels = torch::empty({rows, seq}, opts);
  auto* t = tokens.data_ptr<int64_t>();
  auto* l = labels.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    auto s = r == 0 ? std::move(first) : samples.sample(static_cast<size_t>(idx[static_cast<size_t>(r)]));
    if (vocab_limit > 0) check_vocab(samples, idx[static_cast<size_t>(r)], s, vocab_limit);
    std::copy(s.begin(), s.end() - 1, t + r * seq);
    std::copy(s.begin() + 1, s.end(), l + r * seq);
  }
  if (eod >= 0) labels.masked_fill_(tokens == eod, -100);
  TokenBatch b;
  b.tokens = tokens;
  b.labels = labels;
  return b;
}

TokenBatch BatchLoader::make(int64_t consumed) const {
  const int64_t last = consumed + global_batch() - 1;
  ME_CHECK(static_cast<size_t>(last) < samples_->size(), "data: the batch at consumed_samples = ", consumed,
           " needs sample ", last, " but the training split has ", samples_->size(),
           " samples (built for the run's train.iters x batch.global)");
  auto b = make_token_batch(*samples_, indices(consumed), o_.pin_memory, o_.eod_mask_loss ? o_.eod : -1, o_.vocab_limit);
  b.first_sample = consumed;
  return b;
}

void BatchLoader::prefetch_loop() {
  for (;;) {
    int64_t at;
    {
      std::unique_lock<std::mutex> g(m_);
      cv_.wait(g, [&] { return stop_ || static_cast<int>(ready_.size()) < o_.prefetch; });
      if (stop_) return;
      at = planned_;
      planned_ += global_batch();
    }
    std::pair<TokenBatch, std::string> item;
    try {
      item.first = make(at);
    } catch (const std::exception& e) {
      item.second = e.what();
    }
    const bool failed = !item.second.empty();
    std::lock_guard<std::mutex> g(m_);
    ready_.push_back(std::move(item));
    cv_.notify_all();
    if (failed) return;  // the consumer raises it; nothing after it is valid
  }
}

TokenBatch BatchLoader::next() {
  if (o_.prefetch <= 0) {
    auto b = make(consumed_);
    consumed_ += global_batch();
    return b;
  }
  std::unique_lock<std::mutex> g(m_);
  cv_.wait(g, [&] { return !ready_.empty(); });
  if (!ready_.front().second.empty()) fail(ready_.front().second);  // stays queued: raised again if asked again
  auto item = std::move(ready_.front());
  ready_.pop_front();
  cv_.notify_all();
  consumed_ += global_batch();
  return std::move(item.first);
}

}  // namespace me::data
