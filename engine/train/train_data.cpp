#include "engine/train/train_data.h"

#include <sys/stat.h>

#include "engine/core/error.h"
#include "engine/core/format.h"
#include "engine/core/log.h"
#include "engine/core/build_config.h"  // ME_HAVE_TOKENIZERS
#if ME_HAVE_TOKENIZERS
#include "engine/data/preprocess.h"
#endif

namespace me::train {

std::unique_ptr<data::Tokenizer> load_tokenizer(const data::TokenizerSpec& spec) {
  if (spec.kind.empty()) return nullptr;
#if ME_HAVE_TOKENIZERS
  return data::make_tokenizer(spec);
#else
  fail("tokenizer '", spec.kind, "' needs the tokenizer library, which this megaengine was built without ",
       "(libpcre2-dev and nlohmann-json3-dev were not found at configure time): install them and rebuild");
#endif
}

data::GPTDataConfig gpt_data_config(const config::DataSpec& spec, int64_t seq, uint64_t seed) {
  data::GPTDataConfig c;
  c.blend = spec.blend;
  c.split = spec.split;
  c.cache_dir = spec.cache_dir;
  c.seq_length = static_cast<size_t>(seq);
  c.seed = seed;
  c.single_is_blend = spec.blend_given;
  return c;
}

void set_eod_mask(const config::DataSpec& spec, const data::Tokenizer* tokenizer, data::LoaderOptions& options) {
  options.eod_mask_loss = spec.eod_mask_loss;
  if (!spec.eod_mask_loss) return;
  ME_CHECK(tokenizer, "data.eod_mask_loss needs data.tokenizer, for its end-of-document id");
  options.eod = tokenizer->eod();
}

namespace {

// Seconds since the epoch of the file's last change; -1 if it does not exist.
double modified(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * static_cast<double>(st.st_mtim.tv_nsec);
}

// Rank 0: data.source -> data.prefix .bin/.idx, unless they are already newer than the source.
void preprocess_source(const config::DataSpec& d, const data::Tokenizer* tokenizer) {
  const std::string& prefix = d.blend.at(0).second;
  const double source_time = modified(d.source);
  ME_CHECK(source_time >= 0, "data.source '", d.source, "' does not exist");
  if (modified(prefix + ".idx") >= source_time && modified(prefix + ".bin") >= source_time) return;
#if ME_HAVE_TOKENIZERS
  data::PreprocessOptions o;
  o.input = d.source;
  o.format = d.source_format;
  o.json_key = d.json_key;
  o.output = prefix;
  o.append_eod = true;
  o.workers = std::max(1u, std::thread::hardware_concurrency());
  o.progress = false;
  log::info("preprocessing ", d.source, " into ", prefix, ".bin/.idx with ", tokenizer->describe());
  const auto s = data::preprocess(o, *tokenizer);
  log::info("preprocessed ", s.documents, " documents, ", s.tokens, " tokens in ", human::seconds(s.seconds), " (",
            human::rate(s.mb_per_s(), "MB/s"), ")");
#else
  (void)tokenizer;
  fail("data.source needs `megaengine preprocess`, which this build lacks (see data.tokenizer)");
#endif
}

}  // namespace

TrainData::TrainData(const config::Recipe& spec, comm::Communicator* comm, DataLayout layout)
    : kind_(spec.data.kind), layout_(layout), rng_(spec.seed), seed_(spec.seed), vocab_limit_(spec.model.vocab) {
  const auto& d = spec.data;
  const int64_t seq = spec.model.seq;
  if (kind_ == "text") {
    text_ = std::make_unique<data::ByteTextDataset>(d.path, d.holdout, seq);
    // A resumed run draws the windows it would have drawn: skip the consumed ones.
    for (int64_t i = 0; i < layout_.consumed_samples / layout_.global_batch; ++i)
      text_->sample(false, layout_.global_batch, rng_);
    text_consumed_ = layout_.consumed_samples;
    description_ = cat("byte-level text ", d.path);
    return;
  }
  ME_CHECK(kind_ == "gpt", "data kind '", kind_, "' is unknown: use me.data.text{} or me.data.gpt{}");
  tokenizer_ = load_tokenizer(d.tokenizer);
  const bool builder = !comm || comm->rank() == 0;
  auto barrier = [&] {
    if (comm) comm->world()->barrier();
  };
  // Errors on rank 0 reach the others as its failure (the communicator names it), not as a hang.
  if (builder && !d.source.empty()) preprocess_source(d, tokenizer_.get());
  barrier();

  const auto c = gpt_data_config(d, seq, spec.seed);
  const std::array<size_t, 3> samples = {static_cast<size_t>(layout_.iters * layout_.global_batch),
                                         static_cast<size_t>(spec.train.eval_iters * layout_.micro), 0};
  std::array<std::shared_ptr<const data::GPTSamples>, 3> splits;
  if (builder) splits = data::build_gpt_splits(c, samples, true);
  barrier();
  if (!builder) splits = data::build_gpt_splits(c, samples, false);
  valid_ = splits[1];

  data::LoaderOptions o;
  o.micro = layout_.micro;
  o.dp = layout_.dp;
  o.dp_rank = layout_.dp_rank;
  o.accumulation = layout_.accumulation;
  o.consumed_samples = layout_.consumed_samples;
  o.pin_memory = layout_.pin_memory;
  o.vocab_limit = vocab_limit_;
  set_eod_mask(d, tokenizer_.get(), o);
  loader_ = std::make_unique<data::BatchLoader>(splits[0], o);
  description_ = cat(d.blend.size() == 1 ? d.blend[0].second : cat("a blend of ", d.blend.size(), " datasets"),
                     " (split ", d.split, ", ", splits[0]->size(), " training samples",
                     tokenizer_ ? ", " + tokenizer_->describe() : std::string(), ")");
}

TrainData::~TrainData() = default;

data::TokenBatch TrainData::next_train() {
  if (loader_) return loader_->next();
  // Text: the whole global batch is drawn on every rank (same seed), each keeps its share,
  // so any layout sees the same global batches as one process would.
  auto batch = text_->sample(false, layout_.global_batch, rng_);
  const int64_t local = layout_.global_batch / layout_.dp;
  data::TokenBatch b;
  b.first_sample = text_consumed_;
  b.tokens = batch.tokens.narrow(0, layout_.dp_rank * local, local);
  b.labels = batch.labels.narrow(0, layout_.dp_rank * local, local);
  if (layout_.pin_memory) {  // as the loader's: a pageable copy to the GPU waits for the queued work
    b.tokens = b.tokens.pin_memory();  // (session 24's traces: the host 5.4 ms a step, behind AdamW)
    b.labels = b.labels.pin_memory();
  }
  text_consumed_ += layout_.global_batch;
  return b;
}

data::TokenBatch TrainData::valid_batch(int64_t i) {
  data::TokenBatch b;
  if (text_) {
    std::mt19937_64 rng(seed_ ^ 0x9e3779b97f4a7c15ULL ^ static_cast<uint64_t>(i));
    auto batch = text_->sample(true, layout_.micro, rng);
    b.tokens = batch.tokens;
    b.labels = batch.labels;
    return b;
  }
  ME_CHECK(valid_, "no validation split was built (train.eval_iters = 0)");
  std::vector<int64_t> idx;
  for (int64_t j = 0; j < layout_.micro; ++j) idx.push_back(i * layout_.micro + j);
  return data::make_token_batch(*valid_, idx, false, -1, vocab_limit_);
}

int64_t TrainData::consumed_samples() const { return loader_ ? loader_->consumed_samples() : text_consumed_; }

int64_t TrainData::vocab() const {
  if (text_) return data::ByteTextDataset::vocab();
  return tokenizer_ ? tokenizer_->vocab_size() : 0;
}

std::vector<int64_t> TrainData::encode(const std::string& text) const {
  if (text_) return data::ByteTextDataset::encode(text);
  ME_CHECK(tokenizer_, "sampling text needs data.tokenizer (e.g. me.tokenizer.gpt2{})");
  return tokenizer_->encode(text);
}

std::string TrainData::decode(const std::vector<int64_t>& ids) const {
  if (text_) return data::ByteTextDataset::decode(ids);
  ME_CHECK(tokenizer_, "sampling text needs data.tokenizer (e.g. me.tokenizer.gpt2{})");
  return tokenizer_->decode(ids);
}

std::string TrainData::describe() const { return description_; }

}  // namespace me::train
