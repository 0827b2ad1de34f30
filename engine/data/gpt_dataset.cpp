// GPT sample indexing, its on-disk cache, and dataset blending. See gpt_dataset.h.
#include "engine/data/gpt_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "engine/core/error.h"
#include "engine/core/files.h"
#include "engine/data/numpy_random.h"

namespace me::data {

namespace {

constexpr uint64_t kCacheVersion = 1;  // the file's layout
// The order of the samples, part of the cache key so that a cache built for another order is
// never reused: 1 = our own std::mt19937_64 shuffles; 2 = Megatron's (numpy's RandomState).
constexpr uint64_t kOrderVersion = 2;
constexpr char kCacheMagic[8] = {'M', 'E', 'G', 'P', 'T', 'I', 'D', 'X'};
constexpr size_t kCacheHeaderBytes = 56;  // magic + 6 x uint64

size_t pad8(size_t n) { return (n + 7) & ~size_t{7}; }

// Parses one split weight: a whole, finite, non-negative decimal number.
double parse_weight(const std::string& part, const std::string& split) {
  const char* s = part.c_str();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  ME_CHECK(!part.empty() && end == s + part.size() && errno == 0 && std::isfinite(v),
           "split '", split, "': '", part, "' is not a number; expected three weights such as \"98,2,0\"");
  ME_CHECK(v >= 0, "split '", split, "': weight ", part, " is negative");
  return v;
}

// Python's round(): to nearest, halves to the even neighbour.
int64_t round_half_even(double x) {
  const double f = std::floor(x);
  const double d = x - f;
  const bool up = d > 0.5 || (d == 0.5 && std::fmod(f, 2.0) != 0.0);
  return static_cast<int64_t>(up ? f + 1 : f);
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string real_idx_path(const IndexedDataset& data) {
  return files::real_path(data.prefix() + ".idx");
}

// Everything that determines the three arrays; its hash names the cache file.
std::string describe(const IndexedDataset& data, std::pair<size_t, size_t> docs, uint64_t tokens,
                     const GPTDatasetConfig& c) {
  return cat("megaengine GPTDataset indices\nversion=", kCacheVersion, "\norder=", kOrderVersion,
             "\nidx=", real_idx_path(data),
             "\nsequences=", data.size(), "\nrange=", docs.first, ",", docs.second,
             "\nsplit_tokens=", tokens, "\nseq_length=", c.seq_length,
             "\nnum_samples=", c.num_samples, "\nseed=", c.seed, "\nadd_extra_token=1\n");
}

void check_args(const IndexedDataset& data, std::pair<size_t, size_t> docs, const GPTDatasetConfig& c) {
  ME_CHECK(c.seq_length > 0, "GPT dataset '", data.prefix(), "': seq_length must be positive");
  ME_CHECK(docs.first < docs.second && docs.second <= data.size(), "GPT dataset '", data.prefix(),
           "': sequence range [", docs.first, ", ", docs.second, ") is empty or outside the ",
           data.size(), " sequences of the dataset");
  ME_CHECK(data.size() <= size_t{INT32_MAX}, "GPT dataset '", data.prefix(), "': ", data.size(),
           " sequences exceed the document index's int32 ids");
  ME_CHECK(c.seed <= UINT32_MAX, "GPT dataset '", data.prefix(), "': seed ", c.seed,
           " is outside [0, 2^32 - 1], the seeds numpy.random.RandomState (Megatron's shuffles) takes");
}

uint64_t split_tokens(const IndexedDataset& data, std::pair<size_t, size_t> docs) {
  uint64_t t = 0;
  for (size_t i = docs.first; i < docs.second; ++i) t += static_cast<uint64_t>(data.length(i));
  return t;
}

struct Arrays {
  std::vector<int32_t> doc;
  std::vector<int64_t> sample, shuffle;
  size_t epochs = 1;
  bool separate = false;
};

Arrays build_arrays(const IndexedDataset& data, std::pair<size_t, size_t> docs, uint64_t tokens,
                    const GPTDatasetConfig& c) {
  ME_CHECK(tokens > 0, "GPT dataset '", data.prefix(), "': sequences [", docs.first, ", ",
           docs.second, ") hold no tokens");
  const uint64_t seq = c.seq_length;
  Arrays a;
  // Epochs: the fewest whose tokens give num_samples samples of seq + 1 overlapping tokens.
  if (c.num_samples > 0)
    for (uint64_t have = tokens; have < c.num_samples * seq + 1; have += tokens) ++a.epochs;
  const uint64_t total = (a.epochs * tokens - 1) / seq;
  ME_CHECK(total > 0, "GPT dataset '", data.prefix(), "': sequences [", docs.first, ", ",
           docs.second, ") hold ", tokens, " tokens, fewer than one sample of seq_length + 1 = ",
           seq + 1);
  uint64_t sans_final = total;
  if (a.epochs > 1) {  // Megatron: shuffle a last epoch under 80% of an epoch's samples on its own
    sans_final = ((a.epochs - 1) * tokens - 1) / seq;
    const uint64_t per_epoch = (tokens - 1) / seq;
    a.separate = c.num_samples - sans_final < static_cast<uint64_t>(0.80 * static_cast<double>(per_epoch));
  }
  const size_t n = docs.second - docs.first;
  a.doc.resize(n * a.epochs);
  for (size_t e = 0; e < a.epochs; ++e)
    for (size_t k = 0; k < n; ++k) a.doc[e * n + k] = static_cast<int32_t>(docs.first + k);
  // One RandomState, as Megatron's: the document index first (the first E-1 epochs, then the
  // last, when separate), then the shuffle index.
  NumpyRandomState rng(static_cast<uint32_t>(c.seed));
  if (a.separate) {
    rng.shuffle(a.doc.data(), n * (a.epochs - 1));
    rng.shuffle(a.doc.data() + n * (a.epochs - 1), n);
  } else {
    rng.shuffle(a.doc.data(), a.doc.size());
  }
  // Sample index: walk the document index, seq + 1 tokens per sample; the next sample starts
  // on the last token of this one.
  std::vector<int32_t> len(n);
  for (size_t k = 0; k < n; ++k) len[k] = data.length(docs.first + k);
  a.sample.reserve(2 * (total + 1));
  size_t pos = 0;
  int64_t off = 0;
  a.sample.insert(a.sample.end(), {0, 0});
  for (uint64_t s = 0; s < total; ++s) {
    int64_t remaining = static_cast<int64_t>(seq) + 1;
    while (remaining != 0) {
      ME_CHECK(pos < a.doc.size(), "internal: GPT sample index ran past the document index");
      const int64_t left = len[static_cast<size_t>(a.doc[pos]) - docs.first] - off;
      remaining -= left;
      if (remaining <= 0) {
        off += remaining + left - 1;
        remaining = 0;
      } else {
        ++pos;
        off = 0;
      }
    }
    a.sample.insert(a.sample.end(), {static_cast<int64_t>(pos), off});
  }
  // Megatron stores this as uint32 below 2^32 - 1 samples, int64 above; the draws are the same.
  a.shuffle.resize(total);
  for (uint64_t i = 0; i < total; ++i) a.shuffle[i] = static_cast<int64_t>(i);
  if (a.separate) {
    rng.shuffle(a.shuffle.data(), sans_final);
    rng.shuffle(a.shuffle.data() + sans_final, total - sans_final);
  } else {
    rng.shuffle(a.shuffle.data(), total);
  }
  return a;
}

// Writes the cache to "<path>.tmp.<pid>" and renames it over `path`.
void write_cache(const std::string& path, const std::string& desc, const Arrays& a) {
  const std::string tmp = cat(path, ".tmp.", ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot write GPT index cache '", tmp, "': ", std::strerror(errno));
  bool ok = true;
  auto put = [&](const void* p, size_t bytes) {
    if (ok && bytes) ok = std::fwrite(p, 1, bytes, f) == bytes;
  };
  const uint64_t zeros = 0;
  const uint64_t head[6] = {kCacheVersion, desc.size(), a.doc.size(), a.shuffle.size(), a.epochs,
                            a.separate ? 1u : 0u};
  put(kCacheMagic, 8);
  put(head, sizeof head);
  put(desc.data(), desc.size());
  put(&zeros, pad8(desc.size()) - desc.size());
  put(a.doc.data(), a.doc.size() * 4);
  put(&zeros, pad8(a.doc.size() * 4) - a.doc.size() * 4);
  put(a.sample.data(), a.sample.size() * 8);
  put(a.shuffle.data(), a.shuffle.size() * 8);
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (ok && std::rename(tmp.c_str(), path.c_str()) == 0) return;
  const int why = ok ? errno : err;
  std::remove(tmp.c_str());
  fail("cannot write GPT index cache '", path, "': ", std::strerror(why));
}

}  // namespace

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::array<std::pair<size_t, size_t>, 3> split_documents(const std::string& split, size_t documents) {
  std::vector<std::string> parts(1);
  for (char ch : split) {
    if (ch == ',' || ch == '/') parts.emplace_back();
    else if (ch != ' ') parts.back() += ch;
  }
  // Megatron fills missing trailing weights with zeros ("98,2" is "98,2,0"); more than three is an error.
  ME_CHECK(parts.size() <= 3, "split '", split, "' has ", parts.size(),
           " weights; expected at most three (train, valid, test) such as \"98,2,0\"");
  while (parts.size() < 3) parts.emplace_back("0");
  double w[3];
  for (int k = 0; k < 3; ++k) w[k] = parse_weight(parts[k], split);
  const double sum = numpy_sum(w, 3);
  ME_CHECK(sum > 0, "split '", split, "': the weights sum to zero");
  // Megatron-core's split matrix: bookends 0, w0, w0 + w1, w0 + w1 + w2 of the normalised
  // weights, each rounded to a sequence as round(bookend x documents).
  double edge = 0;
  int64_t b[4] = {0, 0, 0, 0};
  for (int k = 0; k < 3; ++k) {
    edge += w[k] / sum;
    b[k + 1] = std::min(round_half_even(edge * static_cast<double>(documents)), static_cast<int64_t>(documents));
  }
  std::array<std::pair<size_t, size_t>, 3> out;
  for (int k = 0; k < 3; ++k) out[k] = {static_cast<size_t>(b[k]), static_cast<size_t>(b[k + 1])};
  return out;
}

namespace {
std::string cache_file(const IndexedDataset& data, const GPTDatasetConfig& config, const std::string& desc) {
  std::string base = data.prefix();
  if (!config.cache_dir.empty())
    base = config.cache_dir + "/" + base.substr(base.rfind('/') == std::string::npos ? 0 : base.rfind('/') + 1);
  return base + "_" + hex16(fnv1a64(desc)) + ".gptidx";
}
}  // namespace

std::string GPTDataset::cache_path_for(const IndexedDataset& data, std::pair<size_t, size_t> documents,
                                       const GPTDatasetConfig& config) {
  check_args(data, documents, config);
  return cache_file(data, config, describe(data, documents, split_tokens(data, documents), config));
}

GPTDataset GPTDataset::build_or_load(std::shared_ptr<const IndexedDataset> data,
                                     std::pair<size_t, size_t> documents,
                                     const GPTDatasetConfig& config, bool is_builder) {
  ME_CHECK(data != nullptr, "GPT dataset: no indexed dataset given");
  check_args(*data, documents, config);
  const uint64_t tokens = split_tokens(*data, documents);
  const std::string desc = describe(*data, documents, tokens, config);
  GPTDataset ds;
  ds.cache_path_ = cache_file(*data, config, desc);
  ds.data_ = std::move(data);
  ds.documents_ = documents;
  ds.seq_length_ = config.seq_length;
  if (!is_builder) {
    try {
      ds.load(desc);
    } catch (const Error& e) {
      fail(e.what(), " (only the builder rank writes this cache: build_or_load with is_builder ",
           "must run first, with a barrier before the other ranks load)");
    }
    return ds;
  }
  if (::access(ds.cache_path_.c_str(), F_OK) == 0) {
    try {
      ds.load(desc);
      return ds;
    } catch (const Error&) {}  // a stale or damaged cache under this name: rebuild it
  }
  const Arrays a = build_arrays(*ds.data_, documents, tokens, config);
  write_cache(ds.cache_path_, desc, a);
  ds.load(desc);
  ds.built_ = true;
  return ds;
}

void GPTDataset::load(const std::string& desc) {
  const std::string& path = cache_path_;
  detail::MappedFile f(path);
  const uint8_t* p = f.data();
  const size_t size = f.size();
  ME_CHECK(size >= kCacheHeaderBytes && std::memcmp(p, kCacheMagic, 8) == 0, "GPT index cache '", path,
           "' is not a megaengine index cache");
  uint64_t h[6];
  std::memcpy(h, p + 8, sizeof h);
  ME_CHECK(h[0] == kCacheVersion, "GPT index cache '", path, "' has version ", h[0], ", expected ",
           kCacheVersion);
  const uint64_t desc_len = h[1], docs = h[2], samples = h[3];
  // Bound the counts before multiplying so a corrupt header cannot overflow the size check.
  ME_CHECK(desc_len < size && docs < size && samples < size, "GPT index cache '", path, "' is damaged");
  const size_t doc_at = kCacheHeaderBytes + pad8(desc_len);
  const size_t sample_at = doc_at + pad8(docs * 4);
  const size_t shuffle_at = sample_at + (samples + 1) * 16;
  ME_CHECK(shuffle_at + samples * 8 == size, "GPT index cache '", path, "' has ", size,
           " bytes, its header implies ", shuffle_at + samples * 8, ": truncated or damaged");
  ME_CHECK(std::string(reinterpret_cast<const char*>(p + kCacheHeaderBytes), desc_len) == desc,
           "GPT index cache '", path, "' describes other data (a hash collision or a changed dataset)");
  const auto* doc = reinterpret_cast<const int32_t*>(p + doc_at);
  const auto* sample = reinterpret_cast<const int64_t*>(p + sample_at);
  const auto* shuffle = reinterpret_cast<const int64_t*>(p + shuffle_at);
  // Cheap O(n) range checks, so a damaged file fails here rather than reading out of bounds.
  for (uint64_t k = 0; k < docs; ++k)
    ME_CHECK(doc[k] >= static_cast<int64_t>(documents_.first) &&
                 doc[k] < static_cast<int64_t>(documents_.second),
             "GPT index cache '", path, "': document index entry ", k, " is out of range");
  for (uint64_t k = 0; k <= samples; ++k)
    ME_CHECK(sample[2 * k] >= 0 && static_cast<uint64_t>(sample[2 * k]) < docs && sample[2 * k + 1] >= 0 &&
                 (k == 0 || sample[2 * k] >= sample[2 * k - 2]),
             "GPT index cache '", path, "': sample index row ", k, " is out of range");
  for (uint64_t k = 0; k < samples; ++k)
    ME_CHECK(shuffle[k] >= 0 && static_cast<uint64_t>(shuffle[k]) < samples, "GPT index cache '",
             path, "': shuffle index entry ", k, " is out of range");
  file_ = std::move(f);  // moving keeps the mapping's address, so the pointers stay valid
  doc_ = doc;
  sample_ = sample;
  shuffle_ = shuffle;
  num_docs_ = docs;
  num_samples_ = samples;
  epochs_ = h[4];
  separate_final_epoch_ = h[5] != 0;
}

std::vector<int64_t> GPTDataset::sample(size_t i) const {
  ME_CHECK(i < num_samples_, "GPT sample ", i, " out of range: the dataset has ", num_samples_);
  const size_t k = static_cast<size_t>(shuffle_[i]);
  const auto [b, bo] = sample_index(k);
  const auto [e, eo] = sample_index(k + 1);
  std::vector<int64_t> out;
  out.reserve(seq_length_ + 1);
  for (int64_t pos = b; pos <= e; ++pos) {  // the first piece from bo, the last to eo inclusive
    const auto id = static_cast<size_t>(doc_[pos]);
    const auto from = static_cast<size_t>(pos == b ? bo : 0);
    const auto to = pos == e ? static_cast<size_t>(eo + 1) : static_cast<size_t>(data_->length(id));
    const std::vector<int64_t> part = data_->get(id, from, to - from);
    out.insert(out.end(), part.begin(), part.end());
  }
  ME_CHECK(out.size() == seq_length_ + 1, "GPT sample ", i, " of '", data_->prefix(), "' has ",
           out.size(), " tokens, expected ", seq_length_ + 1, "; the index cache '", cache_path_,
           "' does not match the data");
  return out;
}

TokenOrigin GPTDataset::origin(size_t i, size_t position) const {
  ME_CHECK(i < num_samples_ && position <= seq_length_, "GPT sample ", i, " token ", position, " out of range");
  const size_t k = static_cast<size_t>(shuffle_[i]);
  const auto [b, bo] = sample_index(k);
  const auto [e, eo] = sample_index(k + 1);
  size_t before = 0;  // tokens of the sample in the pieces already passed; the walk of sample()
  for (int64_t pos = b; pos <= e; ++pos) {
    const auto id = static_cast<size_t>(doc_[pos]);
    const auto from = static_cast<size_t>(pos == b ? bo : 0);
    const auto to = pos == e ? static_cast<size_t>(eo + 1) : static_cast<size_t>(data_->length(id));
    if (position < before + (to - from)) return {data_->bin_path(), data_->document_of(id), id, from + position - before};
    before += to - from;
  }
  fail("GPT sample ", i, " of '", data_->prefix(), "' has no token ", position, "; the index cache '", cache_path_,
       "' does not match the data");
}

// ---- Blending ----

std::vector<double> normalize_weights(const std::vector<double>& weights) {
  ME_CHECK(!weights.empty(), "blend: no weights given");
  ME_CHECK(weights.size() <= 65535, "blend: ", weights.size(), " datasets, at most 65535");
  for (double w : weights)
    ME_CHECK(std::isfinite(w) && w >= 0, "blend: weight ", w, " is not a finite non-negative number");
  const double sum = numpy_sum(weights.data(), weights.size());
  ME_CHECK(sum > 0, "blend: the weights sum to zero");
  std::vector<double> out(weights);
  for (double& w : out) w /= sum;
  return out;
}

BlendIndices build_blend_indices(const std::vector<double>& weights, size_t size) {
  const std::vector<double> w = normalize_weights(weights);
  std::vector<int64_t> count(w.size(), 0);
  BlendIndices out;
  out.dataset_index.resize(size);
  out.dataset_sample_index.resize(size);
  for (size_t n = 0; n < size; ++n) {
    const double at = std::max(static_cast<double>(n), 1.0);
    size_t best = 0;
    double best_err = w[0] * at - static_cast<double>(count[0]);
    for (size_t d = 1; d < w.size(); ++d) {
      const double err = w[d] * at - static_cast<double>(count[d]);
      if (err > best_err) {
        best_err = err;
        best = d;
      }
    }
    out.dataset_index[n] = static_cast<uint16_t>(best);
    out.dataset_sample_index[n] = count[best]++;
  }
  return out;
}

namespace {
// Megatron's _get_size_per_split_per_dataset: ceil(ceil(size x w) x (1 + surplus)).
std::vector<size_t> size_per_dataset(const std::vector<double>& weights, size_t size, double surplus) {
  const std::vector<double> w = normalize_weights(weights);
  std::vector<size_t> out(w.size());
  for (size_t d = 0; d < w.size(); ++d)
    out[d] = static_cast<size_t>(std::ceil(std::ceil(static_cast<double>(size) * w[d]) * (1 + surplus)));
  return out;
}
}  // namespace

std::vector<size_t> blend_samples_needed(const std::vector<double>& weights, size_t size) {
  return size_per_dataset(weights, size, kBlendSurplus);
}

size_t blend_size(const std::vector<double>& weights, size_t size) {
  size_t total = 0;
  for (size_t n : size_per_dataset(weights, size, 0.0)) total += n;
  return total;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const GPTDataset>> datasets,
                               std::vector<double> weights, size_t size)
    : datasets_(std::move(datasets)) {
  ME_CHECK(datasets_.size() == weights.size(), "blend: ", datasets_.size(), " datasets but ",
           weights.size(), " weights");
  weights_ = normalize_weights(weights);           // the builder's normalisation
  index_ = build_blend_indices(weights_, size);     // and BlendedDataset's own, on top
  std::vector<size_t> used(datasets_.size(), 0);
  for (size_t n = 0; n < size; ++n) used[index_.dataset_index[n]]++;
  for (size_t d = 0; d < datasets_.size(); ++d) {
    ME_CHECK(datasets_[d] != nullptr || used[d] == 0, "blend: dataset ", d, " is missing");
    ME_CHECK(used[d] == 0 || used[d] <= datasets_[d]->size(), "blend: dataset ", d, " ('",
             datasets_[d]->cache_path(), "') has ", datasets_[d]->size(), " samples but the blend takes ",
             used[d], " from it; build it with num_samples >= blend_samples_needed(...)[", d, "]");
  }
}

std::pair<size_t, size_t> BlendedDataset::source(size_t i) const {
  ME_CHECK(i < size(), "blended sample ", i, " out of range: the blend has ", size());
  return {index_.dataset_index[i], static_cast<size_t>(index_.dataset_sample_index[i])};
}

std::vector<int64_t> BlendedDataset::sample(size_t i) const {
  const auto [d, k] = source(i);
  return datasets_[d]->sample(k);
}

}  // namespace me::data
