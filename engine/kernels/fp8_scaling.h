// fp8 scaling for Hopper's fp8 GEMMs (precision = "fp8", issue #36): a tensor is multiplied by
// a scale before its cast to fp8 (E4M3 for weights and activations, E5M2 for gradients) so that
// its largest magnitude lands near the format's largest finite value, and the GEMM's result is
// divided by the two operands' scales. The scale comes from the tensor's amax:
//   "current": this step's amax of the tensor itself (one more pass over it);
//   "delayed": the largest amax of the last `history` steps (Transformer Engine's default: the
//              amax is a by-product of the fused cast, kernels.h fp8_cast_transpose, so no pass
//              is added; a tensor that grows faster than the history follows saturates).
// scale = fp8_max / amax / 2^margin; an amax of 0 or not finite keeps the previous scale.
// Everything here is LibTorch operations on the state's device: no host synchronisation on the
// GPU, and the same arithmetic on the CPU, where fp8_round emulates the cast for tests.
#pragma once
#include <torch/torch.h>

#include <string>

#include "engine/kernels/kernels.h"

namespace me::kernels {

// x rounded to the nearest value of format f (round half to even, saturating at +-fp8_max(f),
// subnormals kept, NaN kept), as float32: what a cast to fp8 and back gives.
torch::Tensor fp8_round(const torch::Tensor& x, Fp8 f);

struct Fp8ScalingOptions {
  std::string mode = "delayed";  // delayed | current
  int64_t history = 16;          // steps of amax a delayed scale looks back over
  double margin = 0;             // the scale is divided by 2^margin (headroom)

  void check() const;  // me::Error naming the field and what it expects
};

class Fp8Scale {
 public:
  Fp8Scale(Fp8 format, Fp8ScalingOptions options, const torch::Device& device = torch::kCPU);

  // The scale for casting x now: with "current" computed from x's amax (and recorded); with
  // "delayed" the one the history gives (x not read), except the first time, when there is no
  // history: then from x's amax, as "current". A float32 tensor [1] on the state's device.
  torch::Tensor scale_for(const torch::Tensor& x);
  // A delayed scale's update after the cast: amax (a float32 tensor [1], the cast's by-product)
  // enters the history and the scale follows it.
  void record(const torch::Tensor& amax);
  // On the GPU the fused cast takes its amax into this buffer (float32 [1] on the state's
  // device), and record_cast_amax() then records it and updates a delayed scale in one launch
  // (kernels.h fp8_delayed_scale_update), where record() would take a dozen small ones.
  torch::Tensor& cast_amax();
  void record_cast_amax();
  const torch::Tensor& scale() const { return scale_; }
  const torch::Tensor& history() const { return history_; }
  Fp8 format() const { return format_; }
  bool delayed() const { return options_.mode == "delayed"; }
  bool seeded() const { return seeded_; }  // an amax was recorded (or the state loaded)

  // Checkpoint state: [scale, next history slot, history...] as one float32 tensor, so that a
  // resumed run continues the same scales.
  torch::Tensor state() const;
  void load_state(const torch::Tensor& state);

 private:
  void update_from(const torch::Tensor& amax);
  // Where a scale puts the tensor's amax: the format's largest value, less the margin's headroom.
  double target() const;
  Fp8 format_;
  Fp8ScalingOptions options_;
  torch::Tensor history_, scale_, cast_amax_;
  int64_t next_ = 0;
  bool seeded_ = false;  // an amax was recorded (or the state loaded)
};

}  // namespace me::kernels
