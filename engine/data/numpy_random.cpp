// numpy's legacy MT19937 stream, bounded draw, shuffle, and float64 sum. See numpy_random.h.
#include "engine/data/numpy_random.h"

namespace me::data {

namespace {
constexpr size_t kN = 624, kM = 397;
constexpr uint32_t kMatrixA = 0x9908b0dfu, kUpper = 0x80000000u, kLower = 0x7fffffffu;

uint32_t twist(uint32_t upper_of, uint32_t lower_of, uint32_t far) {
  const uint32_t y = (upper_of & kUpper) | (lower_of & kLower);
  return far ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
}
}  // namespace

NumpyRandomState::NumpyRandomState(uint32_t seed) {
  // Knuth's multiplier, as in the reference init_genrand; the first draw regenerates.
  key_[0] = seed;
  for (size_t i = 1; i < kN; ++i)
    key_[i] = 1812433253u * (key_[i - 1] ^ (key_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  pos_ = kN;
}

void NumpyRandomState::regenerate() {
  size_t i = 0;
  for (; i < kN - kM; ++i) key_[i] = twist(key_[i], key_[i + 1], key_[i + kM]);
  for (; i < kN - 1; ++i) key_[i] = twist(key_[i], key_[i + 1], key_[i + kM - kN]);
  key_[kN - 1] = twist(key_[kN - 1], key_[0], key_[kM - 1]);
  pos_ = 0;
}

uint32_t NumpyRandomState::next_uint32() {
  if (pos_ == kN) regenerate();
  uint32_t y = key_[pos_++];
  y ^= y >> 11;  // tempering
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t NumpyRandomState::next_uint64() {
  const uint64_t high = next_uint32();
  return (high << 32) | next_uint32();
}

uint64_t NumpyRandomState::interval(uint64_t max) {
  if (max == 0) return 0;  // numpy draws nothing for a bound of 0
  uint64_t mask = max;
  for (int s = 1; s < 64; s <<= 1) mask |= mask >> s;
  uint64_t value;
  if (max <= 0xffffffffu) {
    while ((value = next_uint32() & mask) > max) {
    }
  } else {
    while ((value = next_uint64() & mask) > max) {
    }
  }
  return value;
}

namespace {
constexpr size_t kSumBuffer = 8192;  // numpy's NPY_BUFSIZE: a reduction goes buffer by buffer

double pairwise_sum(const double* a, size_t n) {
  if (n < 8) {
    double res = -0.0;  // numpy starts at -0 so that a sum of -0s stays -0
    for (size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (size_t k = 0; k < 8; ++k) r[k] = a[k];
    size_t i = 8;
    for (; i < n - n % 8; i += 8)
      for (size_t k = 0; k < 8; ++k) r[k] += a[i + k];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t half = n / 2;
  half -= half % 8;
  return pairwise_sum(a, half) + pairwise_sum(a + half, n - half);
}
}  // namespace

double numpy_sum(const double* a, size_t n) {
  double sum = 0.0;  // add's identity, then one pairwise sum per buffer of 8192 elements
  for (size_t i = 0; i < n; i += kSumBuffer) sum += pairwise_sum(a + i, n - i < kSumBuffer ? n - i : kSumBuffer);
  return sum;
}

}  // namespace me::data
