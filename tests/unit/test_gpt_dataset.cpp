// GPT sample indexing (split, document / sample / shuffle index, cache) and blending.
// Datasets are built so that token j of sequence s is s * 1000 + j: every token is unique and
// names where it came from, so coverage and boundaries can be checked from samples alone.
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/data/gpt_dataset.h"
#include "engine/data/numpy_random.h"
#include "tests/unit/temp_dir.h"

using namespace me::data;
using Catch::Contains;
namespace fs = std::filesystem;
using Range = std::pair<size_t, size_t>;

namespace {

// Sequence lengths in [0, 300): deterministic, with a few empty sequences.
std::vector<size_t> lengths(size_t n, uint32_t salt = 0) {
  std::vector<size_t> out(n);
  uint32_t x = 2463534242u + salt;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    out[i] = (i % 17 == 5) ? 0 : 1 + x % 299;
  }
  return out;
}

std::shared_ptr<const IndexedDataset> make_dataset(const std::string& prefix, const std::vector<size_t>& lens) {
  IndexedDatasetWriter w(prefix, DType::int32);
  for (size_t s = 0; s < lens.size(); ++s) {
    std::vector<int64_t> t(lens[s]);
    for (size_t j = 0; j < lens[s]; ++j) t[j] = static_cast<int64_t>(s * 1000 + j);
    w.add_sequence(t);
    w.end_document();
  }
  w.finalize();
  return std::make_shared<const IndexedDataset>(prefix);
}

GPTDatasetConfig config(size_t seq, size_t num_samples, uint64_t seed, std::string dir = "") {
  GPTDatasetConfig c;
  c.seq_length = seq;
  c.num_samples = num_samples;
  c.seed = seed;
  c.cache_dir = std::move(dir);
  return c;
}

size_t tokens_in(const std::vector<size_t>& lens, Range r) {
  size_t t = 0;
  for (size_t s = r.first; s < r.second; ++s) t += lens[s];
  return t;
}

// Checks what every sample must satisfy and counts how often each token starts one of the
// [start, start + seq) windows, i.e. appears among a sample's first seq tokens.
std::map<int64_t, size_t> check_samples(const GPTDataset& ds, const std::vector<size_t>& lens, Range r) {
  std::map<int64_t, size_t> covered;
  const size_t seq = ds.seq_length();
  for (size_t i = 0; i < ds.size(); ++i) {
    const std::vector<int64_t> t = ds.sample(i);
    REQUIRE(t.size() == seq + 1);
    for (size_t j = 0; j < t.size(); ++j) {
      const size_t s = static_cast<size_t>(t[j] / 1000), p = static_cast<size_t>(t[j] % 1000);
      REQUIRE(s >= r.first);  // nothing from outside the split
      REQUIRE(s < r.second);
      REQUIRE(p < lens[s]);
      if (j > 0) {  // the next token of the same sequence, or a new sequence's first token
        const size_t ps = static_cast<size_t>(t[j - 1] / 1000), pp = static_cast<size_t>(t[j - 1] % 1000);
        if (s == ps && p == pp + 1) continue;
        REQUIRE(p == 0);
        REQUIRE(pp + 1 == lens[ps]);
      }
    }
    for (size_t j = 0; j < seq; ++j) covered[t[j]]++;
  }
  return covered;
}

bool same_arrays(const GPTDataset& a, const GPTDataset& b) {
  if (a.size() != b.size() || a.document_index_size() != b.document_index_size()) return false;
  for (size_t k = 0; k < a.document_index_size(); ++k)
    if (a.document_index(k) != b.document_index(k)) return false;
  for (size_t k = 0; k <= a.size(); ++k)
    if (a.sample_index(k) != b.sample_index(k)) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (a.shuffle_index(k) != b.shuffle_index(k)) return false;
  return true;
}

}  // namespace

TEST_CASE("split_documents follows Megatron-core's split matrix", "[gpt_dataset]") {
  // Expectations from Megatron-core's parse_and_normalize_split + convert_split_vector_to_split_matrix
  // + int(round(bookend * n)) (blended_megatron_dataset_builder.py); Megatron's None (a split
  // it does not build) is an empty range here.
  using A = std::array<Range, 3>;
  CHECK(split_documents("98,2,0", 1000) == A{Range{0, 980}, {980, 1000}, {1000, 1000}});
  CHECK(split_documents("949,50,1", 1000) == A{Range{0, 949}, {949, 999}, {999, 1000}});
  CHECK(split_documents("90,9,1", 1000) == A{Range{0, 900}, {900, 990}, {990, 1000}});  // Megatron's docstring
  CHECK(split_documents("969,30,1", 423) == A{Range{0, 410}, {410, 423}, {423, 423}});
  CHECK(split_documents("100,0,0", 37) == A{Range{0, 37}, {37, 37}, {37, 37}});
  CHECK(split_documents("98,2,0", 10) == A{Range{0, 10}, {10, 10}, {10, 10}});     // 9.8 -> 10
  CHECK(split_documents("1,1,1", 10) == A{Range{0, 3}, {3, 7}, {7, 10}});          // 3.33, 6.67 -> 3, 7
  CHECK(split_documents("1,1,1", 5) == A{Range{0, 2}, {2, 3}, {3, 5}});            // 1.67, 3.33 -> 2, 3
  CHECK(split_documents("1,1,0", 5) == A{Range{0, 2}, {2, 5}, {5, 5}});            // 2.5 -> 2 (half to even)
  CHECK(split_documents("1,1,0", 7) == A{Range{0, 4}, {4, 7}, {7, 7}});            // 3.5 -> 4
  CHECK(split_documents("0.98/0.02/0", 1000) == split_documents("98,2,0", 1000));
  CHECK(split_documents(" 98, 2, 0", 100) == A{Range{0, 98}, {98, 100}, {100, 100}});
  CHECK(split_documents("98,2,0", 0) == A{Range{0, 0}, {0, 0}, {0, 0}});
  CHECK(split_documents("0,1,1", 3) == A{Range{0, 0}, {0, 2}, {2, 3}});            // 1.5 -> 2
  for (size_t n : {1, 2, 3, 7, 99, 1000, 123457})
    for (const char* s : {"98,2,0", "949,50,1", "1,1,1", "0,0,1", "3,0,7"}) {
      const A a = split_documents(s, n);
      CHECK(a[0].first == 0);
      CHECK(a[2].second == n);
      for (int k = 0; k < 3; ++k) CHECK(a[k].first <= a[k].second);
      CHECK(a[0].second == a[1].first);
      CHECK(a[1].second == a[2].first);
    }
}

TEST_CASE("split_documents rejects malformed strings", "[gpt_dataset]") {
  CHECK(split_documents("98,2", 1000) == split_documents("98,2,0", 1000));  // as Megatron: missing = 0
  CHECK_THROWS_WITH(split_documents("98,2,0,0", 10), Contains("expected at most three"));
  CHECK_THROWS_WITH(split_documents("a,b,c", 10), Contains("'a' is not a number"));
  CHECK_THROWS_WITH(split_documents("98,,2", 10), Contains("is not a number"));
  CHECK_THROWS_WITH(split_documents("98,2x,0", 10), Contains("is not a number"));
  CHECK_THROWS_WITH(split_documents("1e999,1,1", 10), Contains("is not a number"));
  CHECK_THROWS_WITH(split_documents("98,-2,0", 10), Contains("negative"));
  CHECK_THROWS_WITH(split_documents("0,0,0", 10), Contains("sum to zero"));
  CHECK_THROWS_AS(split_documents("", 10), me::Error);
}

TEST_CASE("one epoch uses every token of the split once", "[gpt_dataset]") {
  TempDir dir;
  const std::vector<size_t> lens = lengths(60);
  auto data = make_dataset(dir / "corpus", lens);
  const Range train = split_documents("80,20,0", data->size())[0];
  const Range valid = split_documents("80,20,0", data->size())[1];
  for (Range r : {train, valid})
    for (size_t seq : {1, 7, 64, 257}) {
      const GPTDataset ds = GPTDataset::build_or_load(data, r, config(seq, 0, 42), true);
      const size_t T = tokens_in(lens, r);
      REQUIRE(ds.epochs() == 1);
      REQUIRE(ds.size() == (T - 1) / seq);
      // The document index is a permutation of the split; the shuffle index of the samples.
      std::vector<int32_t> docs;
      for (size_t k = 0; k < ds.document_index_size(); ++k) docs.push_back(ds.document_index(k));
      std::sort(docs.begin(), docs.end());
      for (size_t k = 0; k < docs.size(); ++k) REQUIRE(docs[k] == static_cast<int32_t>(r.first + k));
      std::vector<size_t> inverse(ds.size());
      std::vector<bool> seen(ds.size(), false);
      for (size_t i = 0; i < ds.size(); ++i) {
        const auto k = static_cast<size_t>(ds.shuffle_index(i));
        REQUIRE(!seen[k]);
        seen[k] = true;
        inverse[k] = i;
      }
      // Windows [start, start + seq) tile the epoch: each token at most once, and only the
      // tail that cannot make a whole sample (1..seq tokens) is left uncovered.
      const auto covered = check_samples(ds, lens, r);
      size_t total = 0;
      for (const auto& kv : covered) {
        REQUIRE(kv.second == 1);
        total += kv.second;
      }
      REQUIRE(total == ds.size() * seq);
      REQUIRE(T - total >= 1);
      REQUIRE(T - total <= seq);
      // In unshuffled order, sample k's last token is sample k + 1's first (labels overlap).
      for (size_t k = 0; k + 1 < ds.size(); ++k)
        REQUIRE(ds.sample(inverse[k]).back() == ds.sample(inverse[k + 1]).front());
    }
}

TEST_CASE("num_samples beyond one epoch adds epochs", "[gpt_dataset]") {
  TempDir dir;
  const std::vector<size_t> lens = lengths(40);
  auto data = make_dataset(dir / "corpus", lens);
  const Range r{3, 37};
  const size_t seq = 32, T = tokens_in(lens, r), per_epoch = (T - 1) / seq;
  REQUIRE(T > 8 * seq);
  struct Case { size_t num_samples, epochs; bool separate; };
  for (const Case c : {Case{2 * per_epoch + 2, 3, true}, Case{3 * per_epoch - 1, 3, false},
                       Case{per_epoch + 1, 2, true}, Case{per_epoch, 1, false}}) {
    const GPTDataset ds = GPTDataset::build_or_load(data, r, config(seq, c.num_samples, 9), true);
    CAPTURE(c.num_samples);
    REQUIRE(ds.epochs() == c.epochs);
    REQUIRE(ds.separate_final_epoch() == c.separate);
    REQUIRE(ds.size() >= c.num_samples);
    REQUIRE(ds.size() == (c.epochs * T - 1) / seq);
    const size_t n = r.second - r.first;
    REQUIRE(ds.document_index_size() == n * c.epochs);
    std::map<int32_t, size_t> uses;
    for (size_t k = 0; k < ds.document_index_size(); ++k) uses[ds.document_index(k)]++;
    REQUIRE(uses.size() == n);
    for (const auto& kv : uses) REQUIRE(kv.second == c.epochs);
    if (c.separate) {  // the last epoch is a permutation of the split on its own
      std::vector<int32_t> last;
      for (size_t k = n * (c.epochs - 1); k < n * c.epochs; ++k) last.push_back(ds.document_index(k));
      std::sort(last.begin(), last.end());
      for (size_t k = 0; k < n; ++k) REQUIRE(last[k] == static_cast<int32_t>(r.first + k));
    }
    const auto covered = check_samples(ds, lens, r);
    size_t total = 0;
    for (const auto& kv : covered) {
      REQUIRE(kv.second <= c.epochs);
      total += kv.second;
    }
    REQUIRE(total == ds.size() * seq);
    REQUIRE(c.epochs * T - total <= seq);
  }
}

TEST_CASE("the indices are deterministic for a seed", "[gpt_dataset]") {
  TempDir dir, other;
  const std::vector<size_t> lens = lengths(50, 7);
  auto data = make_dataset(dir / "corpus", lens);
  const Range r{0, 45};
  const GPTDataset a = GPTDataset::build_or_load(data, r, config(16, 2000, 1234), true);
  const GPTDataset b = GPTDataset::build_or_load(data, r, config(16, 2000, 1234, other.path), true);
  REQUIRE(a.built());
  REQUIRE(b.built());  // built independently in another directory
  REQUIRE(a.cache_path() != b.cache_path());
  REQUIRE(same_arrays(a, b));
  for (size_t i = 0; i < a.size(); i += 97) REQUIRE(a.sample(i) == b.sample(i));
  const GPTDataset c = GPTDataset::build_or_load(data, r, config(16, 2000, 1235), true);
  REQUIRE(c.size() == a.size());
  REQUIRE_FALSE(same_arrays(a, c));
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a.sample(i) != c.sample(i);
  REQUIRE(differ > a.size() / 2);
}

TEST_CASE("the shuffles are Megatron's: one RandomState through the document and shuffle indices",
          "[gpt_dataset]") {
  // Megatron-core's _build_document_sample_shuffle_indices: RandomState(seed) shuffles the
  // document index (the first E-1 epochs, then the last, when the final epoch is separate),
  // then the shuffle index (its first part, then the rest, when separate; whole otherwise).
  // numpy_random's own tests tie NumpyRandomState to numpy.
  TempDir dir;
  const std::vector<size_t> lens = lengths(40, 3);
  auto data = make_dataset(dir / "corpus", lens);
  const Range r{4, 36};
  const size_t seq = 32, n = r.second - r.first, T = tokens_in(lens, r), per_epoch = (T - 1) / seq;
  for (size_t num_samples : {size_t{0}, per_epoch + 1, 3 * per_epoch - 1}) {
    for (uint64_t seed : {uint64_t{1234}, uint64_t{42}}) {
      const GPTDataset ds = GPTDataset::build_or_load(data, r, config(seq, num_samples, seed), true);
      CAPTURE(num_samples, seed, ds.epochs(), ds.separate_final_epoch());
      const size_t E = ds.epochs();
      std::vector<int32_t> doc;
      for (size_t e = 0; e < E; ++e)
        for (size_t k = r.first; k < r.second; ++k) doc.push_back(static_cast<int32_t>(k));
      std::vector<int64_t> shuffle(ds.size());
      for (size_t i = 0; i < shuffle.size(); ++i) shuffle[i] = static_cast<int64_t>(i);
      NumpyRandomState rs(static_cast<uint32_t>(seed));
      if (ds.separate_final_epoch()) {
        const size_t sans_final = ((E - 1) * T - 1) / seq;
        rs.shuffle(doc.data(), n * (E - 1));
        rs.shuffle(doc.data() + n * (E - 1), n);
        rs.shuffle(shuffle.data(), sans_final);
        rs.shuffle(shuffle.data() + sans_final, shuffle.size() - sans_final);
      } else {
        rs.shuffle(doc.data(), doc.size());
        rs.shuffle(shuffle.data(), shuffle.size());
      }
      REQUIRE(ds.document_index_size() == doc.size());
      for (size_t k = 0; k < doc.size(); ++k) REQUIRE(ds.document_index(k) == doc[k]);
      for (size_t i = 0; i < shuffle.size(); ++i) REQUIRE(ds.shuffle_index(i) == shuffle[i]);
    }
  }
  // All three kinds were covered: one epoch, a separate final epoch, three epochs shuffled as one.
  CHECK(GPTDataset::build_or_load(data, r, config(seq, per_epoch + 1, 1), true).separate_final_epoch());
  const GPTDataset three = GPTDataset::build_or_load(data, r, config(seq, 3 * per_epoch - 1, 1), true);
  CHECK(three.epochs() == 3);
  CHECK_FALSE(three.separate_final_epoch());
  // numpy's RandomState takes 32-bit seeds only.
  CHECK_THROWS_WITH(GPTDataset::build_or_load(data, r, config(seq, 0, uint64_t{1} << 32), true),
                    Contains("seed 4294967296") && Contains("2^32 - 1"));
}

TEST_CASE("the index cache is reused and named by what determines it", "[gpt_dataset]") {
  TempDir dir;
  auto data = make_dataset(dir / "corpus", lengths(30));
  const Range r{0, 30};
  const GPTDatasetConfig cfg = config(8, 500, 5);
  const std::string path = GPTDataset::cache_path_for(*data, r, cfg);
  REQUIRE(path.rfind(dir / "corpus_", 0) == 0);
  REQUIRE(!fs::exists(path));
  // A non-builder finds nothing to load.
  CHECK_THROWS_WITH(GPTDataset::build_or_load(data, r, cfg, false), Contains("builder"));

  const GPTDataset first = GPTDataset::build_or_load(data, r, cfg, true);
  REQUIRE(first.built());
  REQUIRE(first.cache_path() == path);
  REQUIRE(fs::exists(path));
  const auto stamp = fs::last_write_time(path);
  const GPTDataset again = GPTDataset::build_or_load(data, r, cfg, true);
  const GPTDataset other_rank = GPTDataset::build_or_load(data, r, cfg, false);
  REQUIRE_FALSE(again.built());  // loaded, not rebuilt
  REQUIRE_FALSE(other_rank.built());
  REQUIRE(fs::last_write_time(path) == stamp);
  REQUIRE(same_arrays(first, again));
  REQUIRE(same_arrays(first, other_rank));
  REQUIRE(first.sample(3) == other_rank.sample(3));

  // Every input that shapes the arrays changes the name; the name is stable otherwise.
  REQUIRE(GPTDataset::cache_path_for(*data, r, cfg) == path);
  REQUIRE(GPTDataset::cache_path_for(*data, r, config(8, 500, 6)) != path);
  REQUIRE(GPTDataset::cache_path_for(*data, r, config(9, 500, 5)) != path);
  REQUIRE(GPTDataset::cache_path_for(*data, r, config(8, 501, 5)) != path);
  REQUIRE(GPTDataset::cache_path_for(*data, Range{0, 29}, cfg) != path);
  // The order's version is part of what names the file (a cache of the older order, made with
  // std::mt19937_64, is rebuilt, not reused).
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.find("\norder=2\n") != std::string::npos);

  // A damaged cache: a non-builder refuses it, the builder rebuilds it.
  fs::resize_file(path, fs::file_size(path) - 8);
  CHECK_THROWS_WITH(GPTDataset::build_or_load(data, r, cfg, false), Contains("truncated"));
  // (first, again and other_rank map that very file, so compare with an independent build.)
  TempDir elsewhere;
  GPTDatasetConfig cfg2 = cfg;
  cfg2.cache_dir = elsewhere.path;
  const GPTDataset reference = GPTDataset::build_or_load(data, r, cfg2, true);
  const GPTDataset rebuilt = GPTDataset::build_or_load(data, r, cfg, true);
  REQUIRE(rebuilt.built());
  REQUIRE(same_arrays(reference, rebuilt));
  // No temporary files are left behind.
  for (const auto& e : fs::directory_iterator(dir.path))
    REQUIRE(e.path().string().find(".tmp") == std::string::npos);
}

TEST_CASE("GPTDataset rejects bad arguments", "[gpt_dataset]") {
  TempDir dir;
  auto data = make_dataset(dir / "corpus", {5, 0, 3});
  CHECK_THROWS_WITH(GPTDataset::build_or_load(data, Range{0, 3}, config(0, 0, 1), true),
                    Contains("seq_length"));
  CHECK_THROWS_WITH(GPTDataset::build_or_load(data, Range{2, 2}, config(4, 0, 1), true), Contains("empty"));
  CHECK_THROWS_WITH(GPTDataset::build_or_load(data, Range{0, 4}, config(4, 0, 1), true), Contains("outside"));
  CHECK_THROWS_WITH(GPTDataset::build_or_load(data, Range{1, 2}, config(4, 0, 1), true), Contains("no tokens"));
  CHECK_THROWS_WITH(GPTDataset::build_or_load(data, Range{0, 3}, config(8, 0, 1), true),
                    Contains("fewer than one sample"));
  // The same split with num_samples set repeats it as often as needed.
  const GPTDataset ds = GPTDataset::build_or_load(data, Range{0, 3}, config(8, 10, 1), true);
  REQUIRE(ds.size() >= 10);
  REQUIRE(ds.epochs() == 11);  // 8 tokens an epoch, 10 x 8 + 1 needed
  CHECK_THROWS_WITH(ds.sample(ds.size()), Contains("out of range"));
}

TEST_CASE("blending follows the weights at every prefix", "[gpt_dataset]") {
  // Megatron's greedy rule never lets a dataset run more than one sample ahead of its share
  // (the pick always has a non-negative deficit). How far one can fall behind depends on the
  // weights: within one sample for these, but e.g. {0.05, 0.15, 0.8} lags by up to 1.2.
  struct Case { std::vector<double> w; double behind; };
  for (const Case& cs : {Case{{0.3, 0.7}, 1.0}, Case{{0.2, 0.5, 0.3}, 1.0}, Case{{2, 5, 3}, 1.0},
                         Case{{1, 1, 1, 1, 1, 1, 1}, 1.0}, Case{{0.1, 0.2, 0.3, 0.4}, 1.0},
                         Case{{0.05, 0.15, 0.8}, 1.25}}) {
    const std::vector<double>& w = cs.w;
    const size_t n = 20000;
    const BlendIndices b = build_blend_indices(w, n);
    double sum = 0;
    for (double x : w) sum += x;
    std::vector<int64_t> count(w.size(), 0);
    for (size_t i = 0; i < n; ++i) {
      const size_t d = b.dataset_index[i];
      REQUIRE(d < w.size());
      REQUIRE(b.dataset_sample_index[i] == count[d]);  // each dataset is read in order
      count[d]++;
      for (size_t e = 0; e < w.size(); ++e) {  // after i + 1 picks
        const double ahead = static_cast<double>(count[e]) - w[e] / sum * static_cast<double>(i + 1);
        REQUIRE(ahead <= 1.0);
        REQUIRE(-ahead <= cs.behind);
      }
      if (i + 1 == 1000)
        for (size_t e = 0; e < w.size(); ++e)
          REQUIRE(std::abs(static_cast<double>(count[e]) / 1000.0 - w[e] / sum) <= 0.01);
    }
  }
  // Unnormalised weights mean the same; the result is deterministic.
  const BlendIndices a = build_blend_indices({2, 5, 3}, 1000), c = build_blend_indices({0.2, 0.5, 0.3}, 1000);
  REQUIRE(a.dataset_index == c.dataset_index);
  REQUIRE(a.dataset_sample_index == c.dataset_sample_index);
  CHECK_THROWS_WITH(build_blend_indices({0.5, -0.1}, 10), Contains("non-negative"));
  CHECK_THROWS_WITH(build_blend_indices({0, 0}, 10), Contains("sum to zero"));
  CHECK_THROWS_AS(build_blend_indices({}, 10), me::Error);
  CHECK(blend_samples_needed({0.3, 0.7}, 1000) == std::vector<size_t>{302, 704});
  // Megatron's blend length: the sum of ceil(size x w), here 1 + 1 + 1 more than asked.
  CHECK(blend_size({0.3, 0.7}, 1000) == 1000);
  CHECK(blend_size({1, 1, 1}, 1000) == 1002);
  CHECK(blend_samples_needed({1, 1, 1}, 1000) == std::vector<size_t>{336, 336, 336});  // ceil(334 x 1.005)
  // normalize_weights divides by numpy's pairwise sum, not a left-to-right one.
  std::vector<double> many(10, 1.0);
  many[0] = 1e16;
  const std::vector<double> w = normalize_weights(many);
  double left = 0;
  for (double x : many) left += x;
  REQUIRE(left != numpy_sum(many.data(), many.size()));
  CHECK(w[1] == 1.0 / numpy_sum(many.data(), many.size()));
}

TEST_CASE("BlendedDataset delegates to its datasets", "[gpt_dataset]") {
  TempDir dir;
  const std::vector<size_t> la = lengths(20, 1), lb = lengths(25, 2);
  auto da = make_dataset(dir / "a", la), db = make_dataset(dir / "b", lb);
  const std::vector<double> w{0.3, 0.7};
  const size_t n = 400;
  const std::vector<size_t> need = blend_samples_needed(w, n);
  auto ga = std::make_shared<const GPTDataset>(GPTDataset::build_or_load(da, Range{0, 20}, config(16, need[0], 3), true));
  auto gb = std::make_shared<const GPTDataset>(GPTDataset::build_or_load(db, Range{0, 25}, config(16, need[1], 3), true));
  const BlendedDataset blend({ga, gb}, w, n);
  REQUIRE(blend.size() == n);
  size_t from_a = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto [d, k] = blend.source(i);
    REQUIRE(blend.sample(i) == (d == 0 ? ga : gb)->sample(k));
    from_a += d == 0;
  }
  REQUIRE(from_a == 120);
  CHECK_THROWS_WITH(BlendedDataset({ga, gb}, {0.3}, n), Contains("weights"));
  // A dataset too small for its share is refused up front.
  auto tiny = std::make_shared<const GPTDataset>(GPTDataset::build_or_load(da, Range{0, 2}, config(16, 1, 3), true));
  CHECK_THROWS_WITH(BlendedDataset({tiny, gb}, w, n), Contains("blend_samples_needed"));
}

TEST_CASE("origin names the sequence, document and offset of every token of every sample", "[gpt_dataset]") {
  TempDir dir;
  // Documents of several sequences (and one empty document), so documents and sequences differ.
  IndexedDatasetWriter w(dir / "multi", DType::int32);
  const std::vector<size_t> lens = lengths(50, 3);
  for (size_t s = 0; s < lens.size(); ++s) {
    std::vector<int64_t> t(lens[s]);
    for (size_t j = 0; j < lens[s]; ++j) t[j] = static_cast<int64_t>(s * 1000 + j);
    w.add_sequence(t);
    if (s % 3 == 2) w.end_document();
    if (s == 20) w.end_document();  // an empty document after sequence 20's
  }
  w.finalize();
  auto data = std::make_shared<const IndexedDataset>(dir / "multi");
  REQUIRE(data->documents() == 50 / 3 + 2);
  CHECK(data->document_of(0) == 0);
  CHECK(data->document_of(2) == 0);
  CHECK(data->document_of(3) == 1);
  CHECK(data->document_of(21) == 8);  // document 7 is the empty one
  CHECK(data->document_of(49) == 17);
  CHECK_THROWS_WITH(data->document_of(50), Contains("out of range"));
  CHECK(data->bin_path() == dir / "multi.bin");

  const GPTDataset ds = GPTDataset::build_or_load(data, {0, 50}, config(37, 300, 9), true);
  REQUIRE(ds.epochs() > 1);
  for (size_t i = 0; i < ds.size(); ++i) {
    const auto s = ds.sample(i);
    for (size_t p = 0; p < s.size(); ++p) {
      const TokenOrigin o = ds.origin(i, p);
      // tokens are sequence * 1000 + offset: the value itself says where it was read
      REQUIRE(static_cast<int64_t>(o.sequence * 1000 + o.offset) == s[p]);
      REQUIRE(o.document == data->document_of(o.sequence));
      REQUIRE(o.bin_path == dir / "multi.bin");
    }
  }
  CHECK_THROWS_WITH(ds.origin(0, 38), Contains("out of range"));
}
