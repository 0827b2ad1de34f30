// Rotary position embedding in one pass: the composition (narrow, negate, cat, two multiplies
// and an add, in the storage dtype) makes five temporaries per call; this reads each pair once,
// rotates in fp32 and writes once. Backward is the same kernel with the angle negated.
#include "engine/kernels/common.cuh"

namespace me::kernels {
namespace {

using detail::from_float;
using detail::to_float;

// One thread per (row, i) with i < d/2; rows numbered (batch, position, group, rep), rep
// fastest: consecutive heads of a position are adjacent in memory.
template <typename T>
__global__ void rotary_kernel(const T* __restrict__ x, T* __restrict__ y, RowLayout in, RowLayout out, int64_t half,
                              const float* __restrict__ cos_half, const float* __restrict__ sin_half, float sign,
                              int64_t total) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx % half;
    int64_t row = idx / half;
    const int64_t r = row % in.rep;
    row /= in.rep;
    const int64_t g = row % in.groups;
    row /= in.groups;
    const int64_t s = row % in.seq;
    const int64_t b = row / in.seq;
    const T* xr = x + b * in.stride_batch + s * in.stride_seq + g * in.stride_group + r * in.stride_rep;
    T* yr = y + b * out.stride_batch + s * out.stride_seq + g * out.stride_group + r * out.stride_rep;
    const float c = cos_half[s * half + i], sn = sign * sin_half[s * half + i];
    const float x1 = to_float(xr[i]), x2 = to_float(xr[i + half]);
    yr[i] = from_float<T>(x1 * c - x2 * sn);
    yr[i + half] = from_float<T>(x2 * c + x1 * sn);
  }
}

constexpr int kThreads = 256;

}  // namespace

void rotary(DType t, const void* x, const RowLayout& in, void* y, const RowLayout& out, int64_t head_dim,
            const float* cos_half, const float* sin_half, bool inverse, void* stream) {
  if (head_dim % 2 != 0) throw std::runtime_error("rotary: head_dim must be even");
  const int64_t half = head_dim / 2;
  const int64_t total = in.batch * in.seq * in.groups * in.rep * half;
  if (total == 0) return;
  ME_DISPATCH_FLOAT(t, "rotary", {
    rotary_kernel<scalar_t><<<detail::grid_for(total, kThreads), kThreads, 0, detail::as_stream(stream)>>>(
        static_cast<const scalar_t*>(x), static_cast<scalar_t*>(y), in, out, half, cos_half, sin_half,
        inverse ? -1.f : 1.f, total);
  });
  detail::check_launch("rotary");
}

}  // namespace me::kernels
