// The last step of the copy engines' reduce-scatter: this rank's partial sums plus what each peer
// pushed, in one pass. Three separate add_ calls at tp 4 read and write the accumulator three
// times (9 passes over a chunk); here it is read once and written once (5 passes).
#include "engine/kernels/common.cuh"

namespace me::kernels {
namespace {

using detail::from_float;
using detail::to_float;
using detail::Vec;

template <typename T>
struct Parts {
  const T* p[kMaxSumParts];
};

// V elements per thread per vector access. Each addition is rounded to T, as add_ rounds its
// result: the same bits as the adds this replaces, in the same order.
template <typename T, int V>
__global__ void sum_parts_kernel(T* __restrict__ acc, Parts<T> parts, int count, int64_t groups) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < groups; i += int64_t{gridDim.x} * blockDim.x) {
    auto a = reinterpret_cast<Vec<T, V>*>(acc)[i];
    float s[V];
#pragma unroll
    for (int k = 0; k < V; ++k) s[k] = to_float(a.v[k]);
    for (int j = 0; j < count; ++j) {
      const auto b = reinterpret_cast<const Vec<T, V>*>(parts.p[j])[i];
#pragma unroll
      for (int k = 0; k < V; ++k) s[k] = to_float(from_float<T>(s[k] + to_float(b.v[k])));
    }
#pragma unroll
    for (int k = 0; k < V; ++k) a.v[k] = from_float<T>(s[k]);
    reinterpret_cast<Vec<T, V>*>(acc)[i] = a;
  }
}

constexpr int kThreads = 256;

}  // namespace

void sum_parts_into(DType t, void* acc, const void* const* parts, int count, int64_t n, void* stream) {
  if (count < 0 || count > kMaxSumParts)
    throw std::runtime_error("sum_parts_into: " + std::to_string(count) + " parts, at most " +
                             std::to_string(kMaxSumParts));
  if (n == 0 || count == 0) return;
  ME_DISPATCH_FLOAT(t, "sum_parts_into", {
    constexpr int V = detail::kVec16<scalar_t>;
    Parts<scalar_t> p{};
    bool vector = n % V == 0 && detail::aligned16(acc);
    for (int j = 0; j < count; ++j) {
      p.p[j] = static_cast<const scalar_t*>(parts[j]);
      vector = vector && detail::aligned16(parts[j]);
    }
    auto* a = static_cast<scalar_t*>(acc);
    if (vector)
      sum_parts_kernel<scalar_t, V>
          <<<detail::grid_for(n / V, kThreads), kThreads, 0, detail::as_stream(stream)>>>(a, p, count, n / V);
    else
      sum_parts_kernel<scalar_t, 1>
          <<<detail::grid_for(n, kThreads), kThreads, 0, detail::as_stream(stream)>>>(a, p, count, n);
  });
  detail::check_launch("sum_parts_into");
}

}  // namespace me::kernels
