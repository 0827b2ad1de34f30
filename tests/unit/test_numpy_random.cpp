// numpy's legacy RandomState, bounded draw, shuffle and float64 sum, against numpy's own
// outputs (tests/unit/numpy_expectations.h, made by bench/reference/numpy_expectations.py).
#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/data/numpy_random.h"
#include "tests/unit/numpy_expectations.h"

using me::data::NumpyRandomState;
using me::data::numpy_sum;

namespace {

std::vector<int64_t> shuffled(uint32_t seed, size_t n) {
  std::vector<int64_t> a(n);
  std::iota(a.begin(), a.end(), 0);
  NumpyRandomState rs(seed);
  rs.shuffle(a.data(), a.size());
  return a;
}

// FNV-1a 64 of the int64 little-endian bytes, as the generating script hashes them.
uint64_t fnv1a64_le(const std::vector<int64_t>& a) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t v : a)
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<uint64_t>(v) >> (8 * b)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  return h;
}

}  // namespace

TEST_CASE("RandomState(1234) gives numpy's raw 32-bit draws", "[numpy_random]") {
  NumpyRandomState rs(1234);
  std::vector<uint32_t> got;
  for (size_t i = 0; i < numpy_expect::kRaw1234.size(); ++i) got.push_back(rs.next_uint32());
  CHECK(got == numpy_expect::kRaw1234);
}

TEST_CASE("the raw stream is MT19937 with init_genrand seeding, past several regenerations", "[numpy_random]") {
  // std::mt19937's seed(value) is the same init_genrand, and its output is fixed by the C++
  // standard: an independent check over 5 x 624 draws.
  for (uint32_t seed : {0u, 1u, 42u, 1234u, 4294967295u}) {
    NumpyRandomState rs(seed);
    std::mt19937 reference(seed);
    for (int i = 0; i < 5 * 624; ++i) REQUIRE(rs.next_uint32() == reference());
  }
  NumpyRandomState a(7), b(7);
  const uint64_t high = a.next_uint32(), low = a.next_uint32();
  CHECK(b.next_uint64() == (high << 32 | low));  // numpy's next64: the first draw is the high half
}

TEST_CASE("interval(max) is numpy's masked bounded draw, 32-bit and 64-bit", "[numpy_random]") {
  auto check = [](uint32_t seed, const std::vector<uint64_t>& expected) {
    NumpyRandomState rs(seed);
    std::vector<uint64_t> got;
    for (uint64_t max : numpy_expect::kIntervalMaxes) got.push_back(rs.interval(max));
    CHECK(got == expected);
  };
  check(1234, numpy_expect::kIntervals1234);
  check(42, numpy_expect::kIntervals42);
}

TEST_CASE("shuffle(arange(n)) is numpy's RandomState.shuffle", "[numpy_random]") {
  CHECK(shuffled(1234, 10) == numpy_expect::kShuffle1234_10);
  CHECK(shuffled(42, 10) == numpy_expect::kShuffle42_10);
  CHECK(shuffled(1234, 1000) == numpy_expect::kShuffle1234_1000);
  CHECK(shuffled(42, 1000) == numpy_expect::kShuffle42_1000);
  struct Big { uint32_t seed; const std::vector<int64_t>& at; uint64_t fnv; };
  for (const Big& b : {Big{1234, numpy_expect::kShuffle1234_big_at, numpy_expect::kShuffle1234_big_fnv},
                       Big{42, numpy_expect::kShuffle42_big_at, numpy_expect::kShuffle42_big_fnv}}) {
    const std::vector<int64_t> a = shuffled(b.seed, static_cast<size_t>(numpy_expect::kBig));
    std::vector<int64_t> at;
    for (int64_t p : numpy_expect::kBigPositions) at.push_back(a[static_cast<size_t>(p)]);
    CHECK(at == b.at);
    CHECK(fnv1a64_le(a) == b.fnv);
  }
  // The element type plays no part in the draws (Megatron shuffles int32 and uint32 arrays).
  std::vector<uint32_t> narrow(1000);
  std::iota(narrow.begin(), narrow.end(), 0u);
  NumpyRandomState rs(1234);
  rs.shuffle(narrow.data(), narrow.size());
  CHECK(std::vector<int64_t>(narrow.begin(), narrow.end()) == numpy_expect::kShuffle1234_1000);
  // Empty and one-element arrays draw nothing.
  NumpyRandomState x(5), y(5);
  int64_t one = 3;
  x.shuffle(&one, 0);
  x.shuffle(&one, 1);
  CHECK(x.next_uint32() == y.next_uint32());
}

TEST_CASE("numpy_sum adds as numpy.sum does", "[numpy_random]") {
  // Below 8 elements: left to right.
  const std::vector<double> w{0.1, 0.2, 0.3};
  CHECK(numpy_sum(w.data(), w.size()) == (0.1 + 0.2) + 0.3);
  // From 8: eight accumulators, then ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), then the rest.
  std::vector<double> v{1e16, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  double r[8];
  for (int k = 0; k < 8; ++k) r[k] = v[static_cast<size_t>(k)];
  const double blocked = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])) + 1 + 1;
  double left = 0;
  for (double x : v) left += x;
  REQUIRE(blocked != left);  // the example tells the two orders apart
  CHECK(numpy_sum(v.data(), v.size()) == blocked);
  CHECK(numpy_sum(nullptr, 0) == 0.0);
  // numpy's own sums of 1/1 .. 1/n; for most n a left-to-right sum differs in the last bits.
  size_t differ_from_left = 0;
  for (size_t k = 0; k < numpy_expect::kSumSizes.size(); ++k) {
    const auto n = static_cast<size_t>(numpy_expect::kSumSizes[k]);
    std::vector<double> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = 1.0 / static_cast<double>(i + 1);
    CAPTURE(n);
    CHECK(numpy_sum(h.data(), n) == numpy_expect::kSums[k]);
    double sum = 0;
    for (double x : h) sum += x;
    differ_from_left += sum != numpy_expect::kSums[k];
  }
  CHECK(differ_from_left > 0);
}
