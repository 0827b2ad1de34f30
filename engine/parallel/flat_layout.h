// Where each parameter sits in the flat fp32 gradient buffer (and, under the distributed
// optimizer, in the flat parameter buffer laid out the same way), and how that buffer is cut
// into the buckets reduced over data parallelism together. Under the distributed optimizer
// every bucket's length is a multiple of the data-parallel size and rank r owns the r-th
// equal piece of each bucket (as Megatron's distributed optimizer cuts it), so a bucket can be
// reduce-scattered, and later all-gathered, on its own while backward is still running.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace me::parallel {

struct FlatRange {
  int64_t start = 0, length = 0;
  // The part of this range that lies inside `other` (length 0 when they do not meet).
  FlatRange within(const FlatRange& other) const {
    const int64_t lo = std::max(start, other.start), hi = std::min(start + length, other.start + other.length);
    return {lo, std::max<int64_t>(0, hi - lo)};
  }
};

struct FlatLayout {
  std::vector<int64_t> offsets;    // parameter i at offsets[i]
  std::vector<FlatRange> buckets;  // in reduction order (backward's), covering the buffer
  int64_t numel = 0;               // the buffer's length, padding included

  // The piece of bucket k that data-parallel rank `rank` of `size` owns.
  FlatRange piece(size_t k, int rank, int size) const {
    const int64_t n = buckets[k].length / size;
    return {buckets[k].start + n * rank, n};
  }
  // That piece of every bucket.
  std::vector<FlatRange> shard(int rank, int size) const {
    std::vector<FlatRange> out;
    for (size_t k = 0; k < buckets.size(); ++k) out.push_back(piece(k, rank, size));
    return out;
  }
  // The bucket holding flat position `at` (the buckets lie back to back, in order).
  size_t bucket_at(int64_t at) const {
    const auto after = std::upper_bound(buckets.begin(), buckets.end(), at,
                                        [](int64_t a, const FlatRange& b) { return a < b.start; });
    return static_cast<size_t>(after - buckets.begin()) - 1;
  }
  // One bucket over parameters packed back to back (no data parallelism).
  static FlatLayout packed(const std::vector<int64_t>& numels) {
    FlatLayout l;
    for (const int64_t n : numels) {
      l.offsets.push_back(l.numel);
      l.numel += n;
    }
    l.buckets.push_back({0, l.numel});
    return l;
  }
};

}  // namespace me::parallel
