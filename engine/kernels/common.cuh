// What the kernel files share: storage <-> fp32 conversion, aligned vectors, warp/block
// reductions, launch checking and the dtype dispatch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "engine/kernels/kernels.h"

namespace me::kernels::detail {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);  // round to nearest even, as LibTorch's casts
}

// N elements loaded or stored as one aligned transaction.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// 16 bytes of T per vector access.
template <typename T>
constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));

__host__ __device__ inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// A CUDA runtime call's error as an exception naming who made it: "who: what: the error".
inline void check_call(cudaError_t e, const char* who, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(who) + ": " + what + ": " + cudaGetErrorString(e));
}

inline void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel ") + kernel + ": " + cudaGetErrorString(e));
}

// Enough blocks to fill the GPU several times over for grid-stride loops.
inline int grid_for(int64_t work_items, int threads) {
  const int64_t blocks = (work_items + threads - 1) / threads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ double warp_sum(double x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <typename T>
__device__ T block_sum(T x) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_sum(x);
  __syncthreads();  // partial may still be read from a previous call
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  x = lane < warps ? partial[lane] : T(0);
  return warp_sum(x);
}

}  // namespace me::kernels::detail

// Runs the statement with `scalar_t` bound to the storage type of `dtype`.
#define ME_DISPATCH_FLOAT(dtype, kernel_name, ...)                           \
  do {                                                                       \
    switch (dtype) {                                                         \
      case ::me::kernels::DType::f32: {                                      \
        using scalar_t = float;                                              \
        __VA_ARGS__;                                                         \
        break;                                                               \
      }                                                                      \
      case ::me::kernels::DType::bf16: {                                     \
        using scalar_t = __nv_bfloat16;                                      \
        __VA_ARGS__;                                                         \
        break;                                                               \
      }                                                                      \
      default:                                                               \
        throw std::runtime_error(std::string(kernel_name) + ": unsupported dtype"); \
    }                                                                        \
  } while (0)
