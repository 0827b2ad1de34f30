// Megatron-style GPT samples over an indexed dataset, and blending of several such datasets.
// Behaviour follows megatron/core/datasets (gpt_dataset.py, blended_dataset.py, helpers.cpp);
// the code is our own. Pure C++17 plus POSIX: no LibTorch.
//
// Unit of splitting and sampling: the SEQUENCE of the indexed dataset. Megatron's GPTDataset
// does the same (numel_low_level_dataset() is the number of sequences: "for GPT, the
// underlying IndexedDataset should be split by sequence, as opposed to, say, BERT, which
// should be split by document"). For text preprocessed the usual way (no sentence splitting)
// every document is one sequence, so the two coincide. The .idx document index is not used.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/data/indexed_dataset.h"

namespace me::data {

// "98,2,0" (or "98/2/0") -> [begin, end) sequence ranges for train, valid, test over
// `documents` elements, as Megatron-core's split matrix: the weights are normalised (missing
// trailing ones are 0), accumulated into bookends 0 <= e1 <= e2 <= e3, and each boundary is
// round(e_k x documents) (round half to even, like Python's round). A zero weight gives an
// empty range (Megatron builds no dataset for that split).
// me::Error for anything but one to three finite non-negative numbers with a positive sum.
std::array<std::pair<size_t, size_t>, 3> split_documents(const std::string& split, size_t documents);

// 64-bit FNV-1a, stable across builds and platforms (std::hash is not).
uint64_t fnv1a64(const std::string& s);

// Where one token of a sample comes from: for error messages that point into the data.
struct TokenOrigin {
  std::string bin_path;  // the indexed dataset's .bin
  size_t document = 0;   // document of the .idx (its document index)
  size_t sequence = 0;   // sequence of the .idx (one per document in the usual preprocessing)
  size_t offset = 0;     // token position within that sequence
};

struct GPTDatasetConfig {
  size_t seq_length = 0;   // tokens per sample are seq_length + 1 (inputs and labels overlap)
  size_t num_samples = 0;  // at least this many samples; 0 = exactly one epoch's worth
  uint64_t seed = 1234;
  std::string cache_dir;   // where the index cache goes; empty = next to the data
};

// One split of one indexed dataset as GPT samples. The three index arrays (Megatron's):
//   document index: the split's sequence ids, repeated for as many epochs as num_samples
//     needs, shuffled (if the last epoch would give under 80% of an epoch's samples, the
//     first E-1 epochs are shuffled together and the last one separately, as Megatron does);
//   sample index: (position in the document index, token offset) where each sample starts,
//     one row more than there are samples; sample k runs from row k to row k+1 plus one token,
//     so consecutive samples share one token and samples cross sequence boundaries;
//   shuffle index: a permutation of the samples (under separate final epoch, the samples of
//     the first E-1 epochs and those of the last are permuted separately).
// Randomness: Megatron's, exactly: one numpy.random.RandomState(seed) (NumpyRandomState,
// numpy_random.h), drawn first for the document index shuffle(s), then for the shuffle index
// (whole, or under separate final epoch its first part then the last). The three arrays are
// therefore Megatron-core GPTDataset's for the same split, seed, seq_length and num_samples,
// and so are the samples, in the same order. seed must lie in [0, 2^32 - 1], as numpy's.
//
// Cache: the arrays live in one file "<prefix>_<16 hex>.gptidx" (or in cache_dir under the
// prefix's base name); the hex is FNV-1a of a description of everything that determines them
// (format version, order version, the .idx's real path, its sequence count, the split range
// and its token count, seq_length, num_samples, seed); a cache of an older order is not reused. The file stores that description too and is
// validated when loaded; it is written to a temporary name and renamed into place.
class GPTDataset {
 public:
  // The builder (rank 0) loads a valid cache or builds and writes it; the others must call
  // this after the builder has finished (the caller puts a barrier in between) and only load:
  // a missing or mismatching cache is then a me::Error.
  static GPTDataset build_or_load(std::shared_ptr<const IndexedDataset> data,
                                  std::pair<size_t, size_t> documents,
                                  const GPTDatasetConfig& config, bool is_builder);
  // The cache file name build_or_load uses for these arguments.
  static std::string cache_path_for(const IndexedDataset& data, std::pair<size_t, size_t> documents,
                                    const GPTDatasetConfig& config);

  // Number of samples: every sample the document index gives (>= num_samples), as Megatron.
  size_t size() const { return num_samples_; }
  // The seq_length + 1 tokens of sample i (after shuffling), widened to int64.
  std::vector<int64_t> sample(size_t i) const;
  // Where token `position` (< seq_length + 1) of sample(i) is stored.
  TokenOrigin origin(size_t i, size_t position) const;

  // The arrays, for tests and tools.
  size_t document_index_size() const { return num_docs_; }
  int32_t document_index(size_t k) const { return doc_[k]; }
  // Row k of the sample index (k <= size()): {position in the document index, offset}.
  std::pair<int64_t, int64_t> sample_index(size_t k) const { return {sample_[2 * k], sample_[2 * k + 1]}; }
  int64_t shuffle_index(size_t i) const { return shuffle_[i]; }
  size_t epochs() const { return epochs_; }
  bool separate_final_epoch() const { return separate_final_epoch_; }

  const std::string& cache_path() const { return cache_path_; }
  bool built() const { return built_; }  // true: this call built the arrays; false: loaded
  size_t seq_length() const { return seq_length_; }
  std::pair<size_t, size_t> documents() const { return documents_; }

 private:
  GPTDataset() = default;
  void load(const std::string& description);  // maps cache_path_, validates, sets pointers

  std::shared_ptr<const IndexedDataset> data_;
  std::pair<size_t, size_t> documents_{0, 0};
  size_t seq_length_ = 0;
  std::string cache_path_;
  bool built_ = false;
  detail::MappedFile file_;
  const int32_t* doc_ = nullptr;
  const int64_t* sample_ = nullptr;
  const int64_t* shuffle_ = nullptr;
  size_t num_docs_ = 0, num_samples_ = 0, epochs_ = 0;
  bool separate_final_epoch_ = false;
};

// Megatron's normalize(): w / numpy.sum(w) (numpy's pairwise sum, so the last bits agree).
// me::Error unless the weights are finite, non-negative, and sum to more than zero.
std::vector<double> normalize_weights(const std::vector<double>& weights);

// Megatron's blending rule (helpers.cpp build_blending_indices): for each position n, pick the
// dataset d maximising weight[d] x max(n, 1) - count[d] (ties to the lowest d), i.e. the one
// whose realised share lags its weight most; `dataset_index[n]` is d and
// `dataset_sample_index[n]` is count[d] before the pick. The weights are normalised first.
struct BlendIndices {
  std::vector<uint16_t> dataset_index;
  std::vector<int64_t> dataset_sample_index;
};
BlendIndices build_blend_indices(const std::vector<double>& weights, size_t size);

// Megatron's mid_level_dataset_surplus: each dataset of a blend is built 0.5% larger.
constexpr double kBlendSurplus = 0.005;
// Samples each dataset of a blend asked for `size` samples is built with (its num_samples):
// ceil(ceil(size x w) x (1 + kBlendSurplus)), w normalised (Megatron's
// _get_size_per_split_per_dataset with the surplus).
std::vector<size_t> blend_samples_needed(const std::vector<double>& weights, size_t size);
// The length Megatron gives a blend asked for `size` samples: the sum over the datasets of
// ceil(size x w), which can exceed `size` by up to one sample per dataset.
size_t blend_size(const std::vector<double>& weights, size_t size);

class BlendedDataset {
 public:
  // `weights` as given by the user (any positive scale) and `size` the blend's length
  // (blend_size(...) for Megatron's). As Megatron, the weights are normalised twice: once by
  // its dataset builder, once by its BlendedDataset (the second pass can move the last bit).
  // me::Error if the weights are bad, the counts differ, or a dataset has fewer samples
  // than the blend takes from it.
  BlendedDataset(std::vector<std::shared_ptr<const GPTDataset>> datasets,
                 std::vector<double> weights, size_t size);

  size_t size() const { return index_.dataset_index.size(); }
  std::vector<int64_t> sample(size_t i) const;
  TokenOrigin origin(size_t i, size_t position) const { return datasets_[source(i).first]->origin(source(i).second, position); }
  // {dataset, sample within it} that position i delegates to.
  std::pair<size_t, size_t> source(size_t i) const;
  const std::vector<double>& weights() const { return weights_; }  // normalised once

 private:
  std::vector<std::shared_ptr<const GPTDataset>> datasets_;
  std::vector<double> weights_;
  BlendIndices index_;
};

}  // namespace me::data
