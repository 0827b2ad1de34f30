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
// Index: the type of the row arithmetic, 32-bit whenever the count fits (a 64-bit division is a
// long instruction sequence, and this kernel does four per thread).
template <typename T, int V, typename Index>
__global__ void rotary_kernel(const T* __restrict__ x, T* __restrict__ y, RowLayout in, RowLayout out, int64_t half,
                              const float* __restrict__ cos_half, const float* __restrict__ sin_half, float sign,
                              int64_t total) {
  const Index per_row = static_cast<Index>(half / V), reps = static_cast<Index>(in.rep),
              groups = static_cast<Index>(in.groups), seq = static_cast<Index>(in.seq);
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    Index row = static_cast<Index>(idx) / per_row;
    const int64_t i = int64_t(static_cast<Index>(idx) - row * per_row) * V;
    const Index r = row % reps;
    row /= reps;
    const Index g = row % groups;
    row /= groups;
    const Index s = row % seq;
    const Index b = row / seq;
    const T* xr = x + b * in.stride_batch + s * in.stride_seq + g * in.stride_group + r * in.stride_rep + i;
    T* yr = y + b * out.stride_batch + s * out.stride_seq + g * out.stride_group + r * out.stride_rep + i;
    const auto a = *reinterpret_cast<const Vec<T, V>*>(xr);
    const auto c = *reinterpret_cast<const Vec<T, V>*>(xr + half);
    if (!cos_half) {
      *reinterpret_cast<Vec<T, V>*>(yr) = a;
      *reinterpret_cast<Vec<T, V>*>(yr + half) = c;
      continue;
    }
    // The tables' V entries as whole vectors too (half % V == 0 whenever V > 1).
    const auto cs = *reinterpret_cast<const Vec<float, V>*>(cos_half + s * half + i);
    const auto sn = *reinterpret_cast<const Vec<float, V>*>(sin_half + s * half + i);
    Vec<T, V> lo, hi;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float x1 = to_float(a.v[k]), x2 = to_float(c.v[k]), sk = sign * sn.v[k];
      lo.v[k] = from_float<T>(x1 * cs.v[k] - x2 * sk);
      hi.v[k] = from_float<T>(x2 * cs.v[k] + x1 * sk);
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
    const bool narrow = rows * half < (int64_t{1} << 31);
    auto launch = [&](auto kernel, int64_t total) {
      kernel<<<detail::grid_for(total, kThreads), kThreads, 0, st>>>(xs, ys, in, out, half, cos_half, sin_half, sign,
                                                                    total);
    };
    // Vectors of V elements, the tables' fp32 entries too (V * 4 bytes aligned).
    auto table_aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % (sizeof(float) * V) == 0; };
    if (half % V == 0 && divisible(in, V) && divisible(out, V) && detail::aligned16(xs) && detail::aligned16(ys) &&
        (!cos_half || (table_aligned(cos_half) && table_aligned(sin_half)))) {
      const int64_t total = rows * (half / V);
      if (narrow) launch(rotary_kernel<scalar_t, V, uint32_t>, total);
      else launch(rotary_kernel<scalar_t, V, int64_t>, total);
    } else {
      const int64_t total = rows * half;
      if (narrow) launch(rotary_kernel<scalar_t, 1, uint32_t>, total);
      else launch(rotary_kernel<scalar_t, 1, int64_t>, total);
    }
  });
  detail::check_launch("rotary");
}

}  // namespace me::kernels
