// fp8 linear layers (precision = "fp8", issue #36): y = x W^T + b with x and W cast to E4M3 and
// the output gradient to E5M2, each with its own per-tensor scale (fp8_scaling.h), and all three
// GEMMs (forward, input gradient, weight gradient) in fp8 with fp32 accumulation:
//   forward  y  = x  . W^T   a = x [m, k],    b = W [n, k]
//   dgrad    dx = dy . W     a = dy [m, n],   b = W^T [k, n]   (the cast's transposed copy)
//   wgrad    dW = dy^T . x   a = dy^T [n, m], b = x^T [k, m]   (the casts' transposed copies)
// each as "a times b transposed" with both operands row-major, the layout Hopper's fp8 GEMMs
// take. On the GPU (the engine's kernels built): the fused cast + transpose + amax kernel
// (kernels.h fp8_cast_transpose) and cuBLASLt's fp8 GEMMs (kernels.h gemm_fp8). Elsewhere the
// same arithmetic emulated in float32 (fp8_round): the reference the GPU path is tested against.
// The model's layers use these through parallel::linear (layers.h LinearComm::fp8).
#pragma once
#include <torch/torch.h>

#include <deque>
#include <optional>
#include <unordered_map>

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

// A row-major fp8 matrix (uint8 on the GPU; on the CPU float32 holding fp8 values) and what the
// GEMM multiplies it by: 1 / the scale it was cast with (float32 [1]).
struct Fp8Matrix {
  torch::Tensor data, scale_inv;
  Fp8 format = Fp8::e4m3;
  Fp8Matrix rows(int64_t first, int64_t n) const { return {data.narrow(0, first, n), scale_inv, format}; }
};

// A 2-D tensor cast to fp8: `data` [rows, cols], `data_t` its transposed copy [cols, rows]
// (when asked for), both scaled by the same scale.
struct Fp8Tensor {
  torch::Tensor data, data_t, scale_inv;
  Fp8 format = Fp8::e4m3;
  Fp8Matrix matrix() const { return {data, scale_inv, format}; }
  Fp8Matrix transposed() const { return {data_t, scale_inv, format}; }
};

// x [rows, cols] cast with s's scale; a delayed scale then records x's amax for later steps
// (inside an Fp8RecomputeTape's replay: with the scale recorded, and no amax recorded). With
// gelu, gelu(x) (tanh approximation) is what is cast: on the GPU inside the cast kernel where
// the scale needs no pass over the tensor (a delayed scale with a history), else formed first.
Fp8Tensor fp8_cast(const torch::Tensor& x, Fp8Scale& s, bool transposed, bool gelu = false);

// Full recomputation with delayed scales: a block's forward runs twice, without keeping its
// activations and again in backward, and in between its delayed scales move on (each cast
// records its amax, other micro-batches' forwards too). The first run records the scale each
// cast used; the second casts with those and records no amax, so both give the same fp8 values
// (the backward then matches the forward it differentiates) and each amax enters the history once.
class Fp8RecomputeTape {
 public:
  enum class Mode { record, replay };
  // While a Scope lives, fp8_cast on this thread records into (or replays from) the tape.
  class Scope {
   public:
    Scope(Fp8RecomputeTape& tape, Mode mode);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Fp8RecomputeTape* previous_;
    Mode previous_mode_;
  };
  // Recording: the scale s gives this cast, kept for the replay. Replaying: the one kept for s's
  // next cast, or undefined where none was (s's cast was cached then, as a weight's is).
  torch::Tensor record(Fp8Scale& s, const torch::Tensor& scale);
  torch::Tensor replay(const Fp8Scale& s);
  static Fp8RecomputeTape* current(Mode* mode);  // this thread's tape (null: none)

 private:
  std::unordered_map<const Fp8Scale*, std::deque<torch::Tensor>> scales_;
};

// a [m, k] times b [n, k] transposed, dequantized: an fp8 GEMM, out in `out` (+ bias [n] in the
// GEMM's epilogue where given). fast_accum: Hopper's faster accumulation (forward GEMMs only,
// as Transformer Engine).
torch::Tensor fp8_gemm_nt(const Fp8Matrix& a, const Fp8Matrix& b, torch::ScalarType out,
                          const torch::Tensor& bias = {}, bool fast_accum = false);
// The same written into (or, with accumulate, added to) `out` [m, n], float32 or bf16: a weight
// gradient into its main grad.
void fp8_gemm_nt_into(torch::Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b, bool accumulate);

// y = x W^T + b (x [..., in], w [out, in], b [out] or undefined) in fp8, differentiable in x, w
// and b (gradients in their dtypes). `scales` must outlive the backward. in, out and the number
// of rows of x must be multiples of 16 (the fp8 GEMMs' alignment). The reference form of what
// the model's layers do (no communication, no cached weight casts).
torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, Fp8LinearScales& scales);

// Whether the fp8 GEMMs run on Hopper's fp8 tensor cores here (else they are emulated).
bool fp8_gemm_compiled();

// What a model's fp8 layers share: the scaling options, and the weights' version, which the
// trainer advances whenever the optimizer has written the weights (in place, often by kernels
// or collectives that LibTorch's version counters do not see): a weight's cast is reused until then.
struct Fp8Model {
  Fp8ScalingOptions scaling;
  int64_t weights_version = 0;
};

// One layer's fp8 state: its scales, and its weight cast once per weights version (the cast of
// a weight is the same for every micro-batch of a step, and it costs a pass over the weight).
class Fp8Linear {
 public:
  Fp8Linear(const Fp8Model& model, const torch::Device& device);
  Fp8LinearScales scales;
  // w [out, in] in E4M3, with its transposed copy (for the input gradient).
  const Fp8Tensor& weight(const torch::Tensor& w);

 private:
  const Fp8Model* model_;
  Fp8Tensor weight_;
  int64_t weight_version_ = -1;
  const void* weight_data_ = nullptr;
};

// Refuses (me::Error naming it) a width that is not a multiple of 16.
void check_fp8_aligned(int64_t n, const char* what);

}  // namespace me::kernels
