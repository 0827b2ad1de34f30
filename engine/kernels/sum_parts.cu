// The last step of the copy engines' reduce-scatter: this rank's partial sums plus what each peer
// pushed, in one pass. Three separate add_ calls at tp 4 read and write the accumulator three
// times (9 passes over a chunk; 11 with a copy of it first); here it is read once and the sum
// written once (5 passes), in place or into a new tensor. A row-parallel layer's bias joins the
// same pass (a separate add was two more passes and a kernel per layer and micro-batch).
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
// result: the same bits as the adds this replaces, in the same order, the bias last (V divides
// cols, so one vector's elements take consecutive bias entries). N: the number of parts, known at
// compile time so that every part's load is issued before the first addition (with a loop over a
// run-time count each thread had one load in flight at a time: 1.7 TB/s at a GPT-39B chunk, tp 4).
// out may be first: each element is read before it is written, by the same thread.
template <typename T, int V, int N>
__global__ void sum_parts_kernel(T* out, const T* first, Parts<T> parts, int64_t groups, const T* bias, int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < groups; i += int64_t{gridDim.x} * blockDim.x) {
    auto a = reinterpret_cast<const Vec<T, V>*>(first)[i];
    Vec<T, V> b[N > 0 ? N : 1];
#pragma unroll
    for (int j = 0; j < N; ++j) b[j] = reinterpret_cast<const Vec<T, V>*>(parts.p[j])[i];
    float s[V];
#pragma unroll
    for (int k = 0; k < V; ++k) s[k] = to_float(a.v[k]);
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
      for (int k = 0; k < V; ++k) s[k] = to_float(from_float<T>(s[k] + to_float(b[j].v[k])));
    if (bias) {
      const int64_t c = (i * V) % cols;
#pragma unroll
      for (int k = 0; k < V; ++k) s[k] = to_float(from_float<T>(s[k] + to_float(bias[c + k])));
    }
#pragma unroll
    for (int k = 0; k < V; ++k) a.v[k] = from_float<T>(s[k]);
    reinterpret_cast<Vec<T, V>*>(out)[i] = a;
  }
}

// sum_parts_kernel<T, V, N> for N = count (0 .. kMaxSumParts).
template <typename T, int V, int N = 0>
void launch_sum(int count, dim3 grid, int threads, cudaStream_t stream, T* out, const T* first, const Parts<T>& p,
                int64_t groups, const T* bias, int64_t cols) {
  if constexpr (N < kMaxSumParts) {
    if (count != N) return launch_sum<T, V, N + 1>(count, grid, threads, stream, out, first, p, groups, bias, cols);
  }
  sum_parts_kernel<T, V, N><<<grid, threads, 0, stream>>>(out, first, p, groups, bias, cols);
}

constexpr int kThreads = 256;

}  // namespace

void sum_parts(DType t, void* out, const void* first, const void* const* parts, int count, int64_t n, void* stream,
               const void* bias, int64_t cols) {
  if (count < 0 || count > kMaxSumParts)
    throw std::runtime_error("sum_parts: " + std::to_string(count) + " parts, at most " + std::to_string(kMaxSumParts));
  if (bias && (cols <= 0 || n % cols != 0))
    throw std::runtime_error("sum_parts: a bias of " + std::to_string(cols) + " columns for " + std::to_string(n) +
                             " elements (expected rows x cols)");
  if (n == 0) return;
  ME_DISPATCH_FLOAT(t, "sum_parts", {
    constexpr int V = detail::kVec16<scalar_t>;
    Parts<scalar_t> p{};
    const auto* b = static_cast<const scalar_t*>(bias);
    bool vector = n % V == 0 && detail::aligned16(out) && detail::aligned16(first) && (!b || cols % V == 0);
    for (int j = 0; j < count; ++j) {
      p.p[j] = static_cast<const scalar_t*>(parts[j]);
      vector = vector && detail::aligned16(parts[j]);
    }
    auto* o = static_cast<scalar_t*>(out);
    const auto* f = static_cast<const scalar_t*>(first);
    const auto stream_ = detail::as_stream(stream);
    if (vector)
      launch_sum<scalar_t, V>(count, detail::grid_for(n / V, kThreads), kThreads, stream_, o, f, p, n / V, b, cols);
    else
      launch_sum<scalar_t, 1>(count, detail::grid_for(n, kThreads), kThreads, stream_, o, f, p, n, b, cols);
  });
  detail::check_launch("sum_parts");
}

}  // namespace me::kernels
