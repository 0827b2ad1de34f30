// SwiGLU on the fused gate/up projection's interleaved pairs, forward and backward in one pass
// each. The LibTorch composition (silu, mul, and the strided selects' backward) reads and
// writes the [tokens, ffn] tensors five times forward and backward and saves silu's output; here
// each input is read once and only the projection's output is kept for backward.
#include "engine/kernels/common.cuh"

namespace me::kernels {
namespace {

using detail::from_float;
using detail::to_float;
using detail::Vec;

__device__ __forceinline__ float sigmoid(float g) { return 1.f / (1.f + __expf(-g)); }

// P pairs per thread: 2P inputs in, P outputs out, each as one vector access.
template <typename T, int P>
__global__ void swiglu_forward_kernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t groups) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < groups; i += int64_t{gridDim.x} * blockDim.x) {
    const auto in = reinterpret_cast<const Vec<T, 2 * P>*>(gate_up)[i];
    Vec<T, P> y;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float g = to_float(in.v[2 * k]), u = to_float(in.v[2 * k + 1]);
      y.v[k] = from_float<T>(g * sigmoid(g) * u);
    }
    reinterpret_cast<Vec<T, P>*>(out)[i] = y;
  }
}

template <typename T, int P>
__global__ void swiglu_backward_kernel(const T* __restrict__ gate_up, const T* __restrict__ grad_out,
                                       T* __restrict__ grad_gate_up, int64_t groups) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < groups; i += int64_t{gridDim.x} * blockDim.x) {
    const auto in = reinterpret_cast<const Vec<T, 2 * P>*>(gate_up)[i];
    const auto dy = reinterpret_cast<const Vec<T, P>*>(grad_out)[i];
    Vec<T, 2 * P> dx;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float g = to_float(in.v[2 * k]), u = to_float(in.v[2 * k + 1]), d = to_float(dy.v[k]);
      const float s = sigmoid(g);
      dx.v[2 * k] = from_float<T>(d * u * s * (1.f + g * (1.f - s)));
      dx.v[2 * k + 1] = from_float<T>(d * g * s);
    }
    reinterpret_cast<Vec<T, 2 * P>*>(grad_gate_up)[i] = dx;
  }
}

constexpr int kThreads = 256;

}  // namespace

void swiglu_forward(DType t, const void* gate_up, void* out, int64_t n, void* stream) {
  if (n == 0) return;
  ME_DISPATCH_FLOAT(t, "swiglu_forward", {
    constexpr int P = detail::kVec16<scalar_t> / 2;  // 2P inputs = 16 bytes
    const auto* in = static_cast<const scalar_t*>(gate_up);
    auto* y = static_cast<scalar_t*>(out);
    if (n % P == 0 && detail::aligned16(in) && reinterpret_cast<uintptr_t>(y) % (sizeof(scalar_t) * P) == 0)
      swiglu_forward_kernel<scalar_t, P>
          <<<detail::grid_for(n / P, kThreads), kThreads, 0, detail::as_stream(stream)>>>(in, y, n / P);
    else
      swiglu_forward_kernel<scalar_t, 1><<<detail::grid_for(n, kThreads), kThreads, 0, detail::as_stream(stream)>>>(in, y, n);
  });
  detail::check_launch("swiglu_forward");
}

void swiglu_backward(DType t, const void* gate_up, const void* grad_out, void* grad_gate_up, int64_t n,
                     void* stream) {
  if (n == 0) return;
  ME_DISPATCH_FLOAT(t, "swiglu_backward", {
    constexpr int P = detail::kVec16<scalar_t> / 2;
    const auto* in = static_cast<const scalar_t*>(gate_up);
    const auto* dy = static_cast<const scalar_t*>(grad_out);
    auto* dx = static_cast<scalar_t*>(grad_gate_up);
    if (n % P == 0 && detail::aligned16(in) && detail::aligned16(dx) &&
        reinterpret_cast<uintptr_t>(dy) % (sizeof(scalar_t) * P) == 0)
      swiglu_backward_kernel<scalar_t, P>
          <<<detail::grid_for(n / P, kThreads), kThreads, 0, detail::as_stream(stream)>>>(in, dy, dx, n / P);
    else
      swiglu_backward_kernel<scalar_t, 1>
          <<<detail::grid_for(n, kThreads), kThreads, 0, detail::as_stream(stream)>>>(in, dy, dx, n);
  });
  detail::check_launch("swiglu_backward");
}

}  // namespace me::kernels
