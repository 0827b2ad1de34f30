// Rotary position embedding in one pass: the composition (narrow, negate, cat, two multiplies
// and an add, in the storage dtype) makes five temporaries per call; this reads each pair once,
// rotates in fp32 and writes once. Backward is the same kernel with the angle negated.
#include "engine/kernels/common.cuh"

namespace me::kernels {
namespace {

using detail::from_float;
using detail::to_float;
using detail::Vec;

// One thread per (row, V consecutive i < d/2); rows numbered (batch, position, group, rep), rep
// fastest: consecutive heads of a position are adjacent in memory. Null tables: a strided copy.
template <typename T, int V>
__global__ void rotary_kernel(const T* __restrict__ x, T* __restrict__ y, RowLayout in, RowLayout out, int64_t half,
                              const float* __restrict__ cos_half, const float* __restrict__ sin_half, float sign,
                              int64_t total) {
  const int64_t per_row = half / V;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = (idx % per_row) * V;
    int64_t row = idx / per_row;
    const int64_t r = row % in.rep;
    row /= in.rep;
    const int64_t g = row % in.groups;
    row /= in.groups;
    const int64_t s = row % in.seq;
    const int64_t b = row / in.seq;
    const T* xr = x + b * in.stride_batch + s * in.stride_seq + g * in.stride_group + r * in.stride_rep + i;
    T* yr = y + b * out.stride_batch + s * out.stride_seq + g * out.stride_group + r * out.stride_rep + i;
    const auto a = *reinterpret_cast<const Vec<T, V>*>(xr);
    const auto c = *reinterpret_cast<const Vec<T, V>*>(xr + half);
    if (!cos_half) {
      *reinterpret_cast<Vec<T, V>*>(yr) = a;
      *reinterpret_cast<Vec<T, V>*>(yr + half) = c;
      continue;
    }
    Vec<T, V> lo, hi;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float cs = cos_half[s * half + i + k], sn = sign * sin_half[s * half + i + k];
      const float x1 = to_float(a.v[k]), x2 = to_float(c.v[k]);
      lo.v[k] = from_float<T>(x1 * cs - x2 * sn);
      hi.v[k] = from_float<T>(x2 * cs + x1 * sn);
    }
    *reinterpret_cast<Vec<T, V>*>(yr) = lo;
    *reinterpret_cast<Vec<T, V>*>(yr + half) = hi;
  }
}

constexpr int kThreads = 256;

bool divisible(const RowLayout& l, int64_t v) {
  return l.stride_batch % v == 0 && l.stride_seq % v == 0 && l.stride_group % v == 0 && l.stride_rep % v == 0;
}

}  // namespace

void rotary(DType t, const void* x, const RowLayout& in, void* y, const RowLayout& out, int64_t head_dim,
            const float* cos_half, const float* sin_half, bool inverse, void* stream) {
  if (head_dim % 2 != 0) throw std::runtime_error("rotary: head_dim must be even");
  const int64_t half = head_dim / 2;
  const int64_t rows = in.batch * in.seq * in.groups * in.rep;
  if (rows * half == 0) return;
  const float sign = inverse ? -1.f : 1.f;
  ME_DISPATCH_FLOAT(t, "rotary", {
    constexpr int V = detail::kVec16<scalar_t>;
    const auto* xs = static_cast<const scalar_t*>(x);
    auto* ys = static_cast<scalar_t*>(y);
    auto st = detail::as_stream(stream);
    if (half % V == 0 && divisible(in, V) && divisible(out, V) && detail::aligned16(xs) && detail::aligned16(ys)) {
      const int64_t total = rows * (half / V);
      rotary_kernel<scalar_t, V><<<detail::grid_for(total, kThreads), kThreads, 0, st>>>(xs, ys, in, out, half, cos_half,
                                                                                       sin_half, sign, total);
    } else {
      const int64_t total = rows * half;
      rotary_kernel<scalar_t, 1><<<detail::grid_for(total, kThreads), kThreads, 0, st>>>(xs, ys, in, out, half, cos_half,
                                                                                       sin_half, sign, total);
    }
  });
  detail::check_launch("rotary");
}

}  // namespace me::kernels
