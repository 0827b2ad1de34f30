// An fp8 linear layer (precision = "fp8", issue #36): y = x W^T + b with x and W cast to E4M3 and
// the output gradient to E5M2, each with its own per-tensor scale (fp8_scaling.h), and all three
// GEMMs (forward, input gradient, weight gradient) in fp8 with fp32 accumulation:
//   forward  y  = x  . W^T   a = x [m, k],    b = W [n, k]
//   dgrad    dx = dy . W     a = dy [m, n],   b = W^T [k, n]   (the cast's transposed copy)
//   wgrad    dW = dy^T . x   a = dy^T [n, m], b = x^T [k, m]   (the casts' transposed copies)
// each as "a times b transposed" with both operands row-major, the layout Hopper's fp8 GEMMs
// take. On the GPU (LibTorch >= 2.1 with CUDA, the engine's kernels built): the fused cast +
// transpose + amax kernel (kernels.h fp8_cast_transpose) and at::_scaled_mm. Elsewhere the same
// arithmetic emulated in float32 (fp8_round): the reference the GPU path is tested against.
// Not yet wired into the model's layers (tensor and sequence parallelism, the main-grad buffer).
#pragma once
#include <torch/torch.h>

#include "engine/kernels/fp8_scaling.h"

namespace me::kernels {

// One linear layer's scales: input and weight (E4M3), output gradient (E5M2).
struct Fp8LinearScales {
  Fp8LinearScales(const Fp8ScalingOptions& options, const torch::Device& device);
  Fp8Scale input, weight, grad_output;
  // Checkpoint state, the three scales' states one after the other.
  torch::Tensor state() const;
  void load_state(const torch::Tensor& state);
};

// A 2-D tensor cast to fp8: `data` [rows, cols] (a float8 dtype on the GPU; on the CPU float32
// holding fp8 values), `data_t` its transposed copy [cols, rows] (when asked for), and
// `scale_inv` (float32 [1]) = 1 / the scale it was cast with, what the GEMM multiplies back.
struct Fp8Tensor {
  torch::Tensor data, data_t, scale_inv;
};

// x [rows, cols] cast with s's scale; a delayed scale then records x's amax for later steps.
Fp8Tensor fp8_cast(const torch::Tensor& x, Fp8Scale& s, bool transposed);

// a.data [m, k] times b.data [n, k] transposed, dequantized, in `out`: an fp8 GEMM.
torch::Tensor fp8_gemm_nt(const torch::Tensor& a, const torch::Tensor& a_scale_inv, const torch::Tensor& b,
                          const torch::Tensor& b_scale_inv, torch::ScalarType out);

// y = x W^T + b (x [..., in], w [out, in], b [out] or undefined) in fp8, differentiable in x, w
// and b (gradients in their dtypes). `scales` must outlive the backward. in, out and the number
// of rows of x must be multiples of 16 (the fp8 GEMMs' alignment).
torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, Fp8LinearScales& scales);

// Whether fp8_linear runs Hopper's fp8 GEMMs here (else it emulates them).
bool fp8_gemm_compiled();

}  // namespace me::kernels
