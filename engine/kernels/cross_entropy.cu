// Cross entropy straight from bf16 logits: forward is one read of the logits (an online
// max/sum-of-exponentials per row), backward one read and one write (in place if asked). The
// composition it replaces makes an fp32 copy of the [tokens, vocab] logits and walks it six times.
// Columns from `real` on are vocabulary padding: -inf in the softmax, so their probability and
// gradient are 0 and every padding (every tensor-parallel layout) gives the same loss.
#include <cmath>

#include "engine/kernels/common.cuh"

namespace me::kernels {
namespace {

using detail::from_float;
using detail::to_float;
using detail::Vec;

// (max, sum of exp(x - max)) pairs merge associatively.
struct MaxSum {
  float max, sum;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.sum * __expf(a.max - m) + b.sum * __expf(b.max - m)};
}

__device__ MaxSum block_merge(MaxSum x) {
  __shared__ MaxSum partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1)
    x = merge(x, {__shfl_xor_sync(0xffffffffu, x.max, o), __shfl_xor_sync(0xffffffffu, x.sum, o)});
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  x = lane < warps ? partial[lane] : MaxSum{-INFINITY, 0.f};
  for (int o = 16; o > 0; o >>= 1)
    x = merge(x, {__shfl_xor_sync(0xffffffffu, x.max, o), __shfl_xor_sync(0xffffffffu, x.sum, o)});
  return x;
}

// One block per row; V elements per vector access (V = 1 when the row is not 16-byte aligned).
template <typename T, int V>
__global__ void stats_kernel(const T* __restrict__ logits, int64_t vocab, int64_t real,
                             const int64_t* __restrict__ labels, int64_t vocab_start, float* row_max, float* row_sum,
                             float* target) {
  const int64_t r = blockIdx.x;
  const T* x = logits + r * vocab;
  MaxSum acc{-INFINITY, 0.f};
  for (int64_t j = int64_t{threadIdx.x} * V; j < real; j += int64_t{blockDim.x} * V) {
    const auto in = *reinterpret_cast<const Vec<T, V>*>(x + j);
    float v[V];
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = j + k < real ? to_float(in.v[k]) : -INFINITY;
    float m = acc.max;
#pragma unroll
    for (int k = 0; k < V; ++k) m = fmaxf(m, v[k]);
    float s = acc.max == -INFINITY ? 0.f : acc.sum * __expf(acc.max - m);
#pragma unroll
    for (int k = 0; k < V; ++k) s += __expf(v[k] - m);
    acc = {m, s};
  }
  acc = block_merge(acc);
  if (threadIdx.x == 0) {
    row_max[r] = acc.max;
    row_sum[r] = acc.sum;
    const int64_t l = labels[r] - vocab_start;
    target[r] = l >= 0 && l < vocab ? to_float(x[l]) : 0.f;
  }
}

template <typename T, int V>
__global__ void backward_kernel(const T* logits, T* grad, int64_t vocab, int64_t real,
                                const int64_t* __restrict__ labels, int64_t vocab_start, const float* __restrict__ lse,
                                const float* __restrict__ grad_row) {
  const int64_t r = blockIdx.x;
  const T* x = logits + r * vocab;
  T* g = grad + r * vocab;
  const float l = lse[r], scale = grad_row[r];
  const int64_t label = labels[r] - vocab_start;  // outside [0, vocab): no one-hot term here
  for (int64_t j = int64_t{threadIdx.x} * V; j < vocab; j += int64_t{blockDim.x} * V) {
    const auto in = *reinterpret_cast<const Vec<T, V>*>(x + j);
    Vec<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float e = j + k < real ? __expf(to_float(in.v[k]) - l) : 0.f;  // padding: probability 0
      const float p = e - (j + k == label ? 1.f : 0.f);
      out.v[k] = from_float<T>(p * scale);
    }
    *reinterpret_cast<Vec<T, V>*>(g + j) = out;
  }
}

int threads_for(int64_t vocab) { return vocab >= 16384 ? 512 : vocab >= 2048 ? 256 : 128; }

}  // namespace

void cross_entropy_stats(DType t, const void* logits, int64_t rows, int64_t vocab, int64_t real,
                         const int64_t* labels, int64_t vocab_start, float* row_max, float* row_sum_exp, float* target,
                         void* stream) {
  if (rows == 0) return;
  real = real < 0 || real > vocab ? vocab : real;
  ME_DISPATCH_FLOAT(t, "cross_entropy_stats", {
    constexpr int V = detail::kVec16<scalar_t>;
    const auto* x = static_cast<const scalar_t*>(logits);
    const int threads = threads_for(vocab);
    if (vocab % V == 0 && detail::aligned16(x))
      stats_kernel<scalar_t, V><<<rows, threads, 0, detail::as_stream(stream)>>>(x, vocab, real, labels,
                                                                                 vocab_start, row_max, row_sum_exp,
                                                                                 target);
    else
      stats_kernel<scalar_t, 1><<<rows, threads, 0, detail::as_stream(stream)>>>(x, vocab, real, labels,
                                                                                 vocab_start, row_max, row_sum_exp,
                                                                                 target);
  });
  detail::check_launch("cross_entropy_stats");
}

void cross_entropy_backward(DType t, const void* logits, void* grad, int64_t rows, int64_t vocab, int64_t real,
                            const int64_t* labels, int64_t vocab_start, const float* lse, const float* grad_row,
                            void* stream) {
  if (rows == 0) return;
  real = real < 0 || real > vocab ? vocab : real;
  ME_DISPATCH_FLOAT(t, "cross_entropy_backward", {
    constexpr int V = detail::kVec16<scalar_t>;
    const auto* x = static_cast<const scalar_t*>(logits);
    auto* g = static_cast<scalar_t*>(grad);
    const int threads = threads_for(vocab);
    if (vocab % V == 0 && detail::aligned16(x) && detail::aligned16(g))
      backward_kernel<scalar_t, V><<<rows, threads, 0, detail::as_stream(stream)>>>(x, g, vocab, real, labels,
                                                                                    vocab_start, lse, grad_row);
    else
      backward_kernel<scalar_t, 1><<<rows, threads, 0, detail::as_stream(stream)>>>(x, g, vocab, real, labels,
                                                                                    vocab_start, lse, grad_row);
  });
  detail::check_launch("cross_entropy_backward");
}

}  // namespace me::kernels
