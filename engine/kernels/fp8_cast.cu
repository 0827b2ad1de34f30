// fp8_cast_transpose (kernels.h): a 32 x 32 tile per block of 32 x 8 threads. The tile is read
// once, row by row (coalesced); each element is scaled, cast and written to `out` in place; the
// fp8 bytes go through shared memory so that the transpose is written row by row too; |x| feeds
// the block's amax, one atomic per block. Bandwidth-bound: bf16 in, 1 or 2 fp8 bytes out.
#include <cuda_fp8.h>

#include "engine/kernels/common.cuh"

namespace me::kernels {

namespace {

constexpr int kTile = 32, kRowsPerPass = 8;

template <Fp8 F>
__device__ __forceinline__ uint8_t to_fp8(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, F == Fp8::e4m3 ? __NV_E4M3 : __NV_E5M2));
}

// max of non-negative floats through their bit patterns (which order like the values).
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
}

template <typename T, Fp8 F>
__global__ void cast_transpose_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, const float* __restrict__ scale,
                                      uint8_t* __restrict__ out, uint8_t* __restrict__ out_t, float* __restrict__ amax) {
  __shared__ uint8_t tile[kTile][kTile + 4];  // + 4: no bank conflicts on the column reads
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const float s = *scale;
  float local_max = 0.f;
  for (int i = ty; i < kTile; i += kRowsPerPass) {
    const int64_t r = r0 + i, c = c0 + tx;
    uint8_t q = 0;
    if (r < rows && c < cols) {
      const float v = detail::to_float(x[r * cols + c]);
      local_max = fmaxf(local_max, fabsf(v));
      q = to_fp8<F>(v * s);
      out[r * cols + c] = q;
    }
    tile[i][tx] = q;
  }
  if (out_t) {
    __syncthreads();
    for (int i = ty; i < kTile; i += kRowsPerPass) {  // row i of the transposed tile: column c0 + i
      const int64_t c = c0 + i, r = r0 + tx;
      if (c < cols && r < rows) out_t[c * rows + r] = tile[tx][i];
    }
  }
  // the block's amax: a warp reduction, then one atomic per warp (NaN compares false: skipped)
  for (int o = 16; o > 0; o >>= 1) local_max = fmaxf(local_max, __shfl_xor_sync(0xffffffffu, local_max, o));
  if (tx == 0 && local_max > 0.f) atomic_max_nonneg(amax, local_max);
}

}  // namespace

void fp8_cast_transpose(DType t, Fp8 f, const void* x, int64_t rows, int64_t cols, const float* scale, uint8_t* out,
                        uint8_t* out_t, float* amax, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 block(kTile, kRowsPerPass);
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  const auto st = detail::as_stream(stream);
  ME_DISPATCH_FLOAT(t, "fp8_cast_transpose", {
    const auto* in = static_cast<const scalar_t*>(x);
    if (f == Fp8::e4m3)
      cast_transpose_kernel<scalar_t, Fp8::e4m3><<<grid, block, 0, st>>>(in, rows, cols, scale, out, out_t, amax);
    else
      cast_transpose_kernel<scalar_t, Fp8::e5m2><<<grid, block, 0, st>>>(in, rows, cols, scale, out, out_t, amax);
  });
  detail::check_launch("fp8_cast_transpose");
}

}  // namespace me::kernels
