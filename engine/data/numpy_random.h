// The pieces of numpy that decide Megatron's sample order, written from numpy's sources so
// that our shuffles are bit-for-bit numpy's: the legacy `numpy.random.RandomState(seed)`
// (MT19937, numpy/random/src/mt19937), its bounded draw `random_interval`
// (numpy/random/src/distributions/distributions.c) and `RandomState.shuffle`
// (numpy/random/mtrand.pyx); and `numpy.sum` of float64 (pairwise summation), which
// Megatron's weight normalisation goes through. numpy keeps this legacy stream frozen across
// versions. Pure C++17; no standard-library distributions, so every platform agrees.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace me::data {

class NumpyRandomState {
 public:
  // RandomState(seed) for an integer seed: MT19937's init_genrand seeding (numpy's
  // mt19937_seed). numpy takes seeds in [0, 2^32 - 1] only; the caller checks the range.
  explicit NumpyRandomState(uint32_t seed);

  // One raw 32-bit output: what RandomState.randint(0, 2**32, dtype=np.uint32) returns.
  uint32_t next_uint32();
  // numpy's mt19937_next64: the first 32-bit draw is the high half.
  uint64_t next_uint64();

  // numpy's random_interval(max): uniform in [0, max] by masked rejection: draw, keep the bits
  // of the smallest all-ones mask covering max, retry while above max. 32-bit draws while
  // max < 2^32, 64-bit draws (two 32-bit ones) beyond.
  uint64_t interval(uint64_t max);

  // RandomState.shuffle of a 1-D array: Fisher-Yates from the end, for i = n-1 down to 1,
  // swap a[i] with a[interval(i)]. The element type plays no part in the draws.
  template <typename T>
  void shuffle(T* a, size_t n) {
    for (size_t i = n; i > 1; --i) std::swap(a[i - 1], a[interval(i - 1)]);
  }

 private:
  void regenerate();  // the next 624 words of state (numpy's mt19937_gen)

  std::array<uint32_t, 624> key_{};
  size_t pos_ = 624;
};

// numpy.sum of a contiguous float64 array: 0.0 plus, buffer by buffer of 8192 elements,
// numpy's pairwise sum (8 accumulators over blocks of up to 128, halves beyond). It differs
// from a left-to-right sum in the last bits once there are 8 elements or more.
double numpy_sum(const double* a, size_t n);

}  // namespace me::data
