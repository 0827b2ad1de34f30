// fp8_cast_transpose (kernels.h). Bandwidth-bound: bf16 in, 1 or 2 fp8 bytes out.
// - Rows and columns multiples of 64 (every activation and weight of the model): a 64 x 64 tile
//   per block of 256 threads, each moving 16-byte vectors: the tile read row by row (8 bf16 per
//   thread), its fp8 bytes written row by row and kept in shared memory, from where the
//   transposed copy is written 16 bytes per thread too; |x| reduced over the block, one atomic
//   per block on the amax. (A thread per element and an atomic per warp ran at 515 GB/s on the
//   H100, the atomics on the one amax address the bottleneck.)
// - Any other shape: a 32 x 32 tile per block of 32 x 8 threads, an element per thread.
// Either may apply GeLU to each value first (template G), the amax then being gelu(x)'s.
#include <cuda_fp8.h>

#include "engine/kernels/common.cuh"

namespace me::kernels {

namespace {

constexpr int kTile = 32, kRowsPerPass = 8;

template <Fp8 F>
__device__ __forceinline__ uint8_t to_fp8(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, F == Fp8::e4m3 ? __NV_E4M3 : __NV_E5M2));
}

// GeLU, tanh approximation, as LibTorch's CUDA kernel computes it (float32 opmath).
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;  // sqrt(2 / pi)
  return 0.5f * x * (1.f + tanhf(kBeta * (x + kKappa * x * x * x)));
}
template <bool G>
__device__ __forceinline__ float prologue(float x) {
  if constexpr (G) return gelu_tanh(x);
  return x;
}

// max of non-negative floats through their bit patterns (which order like the values).
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float v) {
  atomicMax(reinterpret_cast<int*>(addr), __float_as_int(v));
}

template <typename T, Fp8 F, bool G>
__global__ void cast_transpose_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, const float* __restrict__ scale,
                                      uint8_t* __restrict__ out, uint8_t* __restrict__ out_t, float* __restrict__ amax,
                                      float* __restrict__ scale_inv) {
  if (scale_inv && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) *scale_inv = 1.f / *scale;
  __shared__ uint8_t tile[kTile][kTile + 4];  // + 4: no bank conflicts on the column reads
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const float s = *scale;
  float local_max = 0.f;
  for (int i = ty; i < kTile; i += kRowsPerPass) {
    const int64_t r = r0 + i, c = c0 + tx;
    uint8_t q = 0;
    if (r < rows && c < cols) {
      const float v = prologue<G>(detail::to_float(x[r * cols + c]));
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

constexpr int kBig = 64, kBigThreads = 256;

// 8 consecutive elements as floats, from one (bf16) or two (f32) 16-byte loads.
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    v[2 * j] = f.x;
    v[2 * j + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

template <typename T, Fp8 F, bool G>
__global__ void __launch_bounds__(kBigThreads)
    cast_transpose_aligned_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, const float* __restrict__ scale,
                                  uint8_t* __restrict__ out, uint8_t* __restrict__ out_t, float* __restrict__ amax,
                                  float* __restrict__ scale_inv) {
  __shared__ uint8_t tile[kBig][kBig + 4];  // + 4: the column reads below spread over the banks
  __shared__ float warp_max[kBigThreads / 32];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kBig, c0 = static_cast<int64_t>(blockIdx.x) * kBig;
  const int tid = static_cast<int>(threadIdx.x);
  const float s = *scale;
  if (scale_inv && blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) *scale_inv = 1.f / s;
  float local_max = 0.f;
  // 64 rows x 8 vectors of 8 columns: two vectors per thread, both loaded before either is used
  float v[2][8];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int e = tid + k * kBigThreads, i = e / 8, seg = e % 8;
    load8(x + (r0 + i) * cols + c0 + seg * 8, v[k]);
  }
  if constexpr (G) {
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
      for (int j = 0; j < 8; ++j) v[k][j] = gelu_tanh(v[k][j]);
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int e = tid + k * kBigThreads, i = e / 8, seg = e % 8;
    uint32_t packed[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      local_max = fmaxf(local_max, fabsf(v[k][j]));
      packed[j / 4] |= static_cast<uint32_t>(to_fp8<F>(v[k][j] * s)) << (8 * (j % 4));
    }
    *reinterpret_cast<uint2*>(out + (r0 + i) * cols + c0 + seg * 8) = make_uint2(packed[0], packed[1]);
    auto* row = reinterpret_cast<uint32_t*>(&tile[i][seg * 8]);  // 4-byte aligned: 68-byte rows
    row[0] = packed[0];
    row[1] = packed[1];
  }
  if (out_t) {
    __syncthreads();
    // transposed row c (the tile's column c) in 4 parts of 16 tile rows: one 16-byte store each
    const int c = tid / 4, part = tid % 4;
    uint32_t packed[4] = {0, 0, 0, 0};
#pragma unroll
    for (int k = 0; k < 16; ++k) packed[k / 4] |= static_cast<uint32_t>(tile[part * 16 + k][c]) << (8 * (k % 4));
    *reinterpret_cast<uint4*>(out_t + (c0 + c) * rows + r0 + part * 16) =
        make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
  // the block's amax (NaN compares false: skipped), one atomic per block
  for (int o = 16; o > 0; o >>= 1) local_max = fmaxf(local_max, __shfl_xor_sync(0xffffffffu, local_max, o));
  if (tid % 32 == 0) warp_max[tid / 32] = local_max;
  __syncthreads();
  if (tid == 0) {
    float m = 0.f;
    for (int w = 0; w < kBigThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    if (m > 0.f) atomic_max_nonneg(amax, m);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__global__ void delayed_scale_update_kernel(float* history, int64_t length, int64_t next, float* amax, float* scale,
                                            float top) {
  history[next] = *amax;
  *amax = 0.f;
  float m = 0.f;
  bool finite = true;
  for (int64_t i = 0; i < length; ++i) {
    const float h = history[i];
    finite = finite && isfinite(h);
    m = fmaxf(m, h);
  }
  if (finite && m > 0.f) *scale = top / m;
}

}  // namespace

namespace {
// One launch of kernel K<scalar_t, F, G> for the runtime format and GeLU switch.
template <template <typename, Fp8, bool> class Launch, typename T, typename... Args>
void dispatch_fp8(Fp8 f, bool gelu, Args... args) {
  if (f == Fp8::e4m3) gelu ? Launch<T, Fp8::e4m3, true>::run(args...) : Launch<T, Fp8::e4m3, false>::run(args...);
  else gelu ? Launch<T, Fp8::e5m2, true>::run(args...) : Launch<T, Fp8::e5m2, false>::run(args...);
}
template <typename T, Fp8 F, bool G>
struct LaunchAligned {
  static void run(dim3 grid, cudaStream_t st, const T* in, int64_t rows, int64_t cols, const float* scale, uint8_t* out,
                  uint8_t* out_t, float* amax, float* scale_inv) {
    cast_transpose_aligned_kernel<T, F, G><<<grid, kBigThreads, 0, st>>>(in, rows, cols, scale, out, out_t, amax, scale_inv);
  }
};
template <typename T, Fp8 F, bool G>
struct LaunchGeneral {
  static void run(dim3 grid, cudaStream_t st, const T* in, int64_t rows, int64_t cols, const float* scale, uint8_t* out,
                  uint8_t* out_t, float* amax, float* scale_inv) {
    cast_transpose_kernel<T, F, G><<<grid, dim3(kTile, kRowsPerPass), 0, st>>>(in, rows, cols, scale, out, out_t, amax,
                                                                               scale_inv);
  }
};
}  // namespace

void fp8_cast_transpose(DType t, Fp8 f, const void* x, int64_t rows, int64_t cols, const float* scale, uint8_t* out,
                        uint8_t* out_t, float* amax, float* scale_inv, void* stream, bool gelu) {
  if (rows <= 0 || cols <= 0) return;
  const auto st = detail::as_stream(stream);
  if (rows % kBig == 0 && cols % kBig == 0 && aligned16(x) && aligned16(out) && (!out_t || aligned16(out_t))) {
    const dim3 grid(static_cast<unsigned>(cols / kBig), static_cast<unsigned>(rows / kBig));
    ME_DISPATCH_FLOAT(t, "fp8_cast_transpose", {
      dispatch_fp8<LaunchAligned, scalar_t>(f, gelu, grid, st, static_cast<const scalar_t*>(x), rows, cols, scale, out,
                                            out_t, amax, scale_inv);
    });
    detail::check_launch("fp8_cast_transpose");
    return;
  }
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  ME_DISPATCH_FLOAT(t, "fp8_cast_transpose", {
    dispatch_fp8<LaunchGeneral, scalar_t>(f, gelu, grid, st, static_cast<const scalar_t*>(x), rows, cols, scale, out,
                                          out_t, amax, scale_inv);
  });
  detail::check_launch("fp8_cast_transpose");
}

void fp8_delayed_scale_update(float* history, int64_t length, int64_t next, float* amax, float* scale, float top,
                              void* stream) {
  delayed_scale_update_kernel<<<1, 1, 0, detail::as_stream(stream)>>>(history, length, next, amax, scale, top);
  detail::check_launch("fp8_delayed_scale_update");
}

}  // namespace me::kernels
