#include "engine/kernels/fp8_scaling.h"

#include <cmath>

#include "engine/core/build_config.h"  // ME_HAVE_CUDA_KERNELS
#include "engine/core/error.h"
#include "engine/core/torch_compat.h"

#if ME_HAVE_CUDA_KERNELS && ME_TORCH_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace me::kernels {

namespace {

// The format's mantissa bits and smallest normal exponent: E4M3 3 and -6, E5M2 2 and -14.
int mantissa_bits(Fp8 f) { return f == Fp8::e4m3 ? 3 : 2; }
int min_normal_exponent(Fp8 f) { return f == Fp8::e4m3 ? -6 : -14; }

}  // namespace

torch::Tensor fp8_round(const torch::Tensor& x, Fp8 f) {
  const auto v = x.to(torch::kFloat32);
  const double max = fp8_max(f);
  const auto mag = v.abs().clamp_max(max);
  // The spacing of representable values around |v|: 2^(e - mantissa bits) with e = floor(log2
  // |v|), or the subnormals' fixed spacing below the smallest normal.
  const auto e = torch::floor(torch::log2(mag.clamp_min(std::ldexp(1.0, min_normal_exponent(f)))));
  const auto quantum = torch::pow(2.0, e - mantissa_bits(f));
  auto rounded = torch::round(mag / quantum) * quantum;  // torch::round: half to even
  rounded = rounded.clamp_max(max) * torch::sign(v);
  return torch::where(torch::isnan(v), v, rounded);
}

void Fp8ScalingOptions::check() const {
  ME_CHECK(mode == "delayed" || mode == "current", "fp8 scaling mode must be \"delayed\" or \"current\", got '", mode, "'");
  ME_CHECK(history >= 1 && history <= 1024, "fp8 amax history must be between 1 and 1024 steps, got ", history);
  ME_CHECK(margin >= 0 && margin <= 16, "fp8 scaling margin must be between 0 and 16 (a power of two of headroom), got ",
           margin);
}

Fp8Scale::Fp8Scale(Fp8 format, Fp8ScalingOptions options, const torch::Device& device)
    : format_(format), options_(std::move(options)) {
  options_.check();
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  history_ = torch::zeros({options_.history}, opts);
  scale_ = torch::ones({1}, opts);
}

double Fp8Scale::target() const { return fp8_max(format_) * std::pow(2.0, -options_.margin); }

void Fp8Scale::update_from(const torch::Tensor& amax) {
  const auto a = amax.to(scale_.device(), torch::kFloat32).reshape({1});
  const auto usable = torch::logical_and(a > 0, torch::isfinite(a));
  scale_.copy_(torch::where(usable, target() / a.clamp_min(1e-30), scale_));
}

torch::Tensor Fp8Scale::scale_for(const torch::Tensor& x) {
  // A delayed scale with no history yet starts from the tensor's own amax: with a scale of 1 the
  // first step's gradients (~1e-6) would fall below E5M2's smallest value and vanish.
  if (options_.mode == "current" || !seeded_) {
    const auto amax = x.detach().abs().max().to(torch::kFloat32).reshape({1});
    record(amax);
    update_from(amax);
  }
  return scale_;
}

void Fp8Scale::record(const torch::Tensor& amax) {
  history_[next_].copy_(amax.to(history_.device(), torch::kFloat32).reshape({}));
  next_ = (next_ + 1) % options_.history;
  seeded_ = true;
  if (options_.mode == "delayed") update_from(history_.max().reshape({1}));
}

torch::Tensor& Fp8Scale::cast_amax() {
  if (!cast_amax_.defined()) cast_amax_ = torch::zeros({1}, scale_.options());
  return cast_amax_;
}

void Fp8Scale::record_cast_amax() {
#if ME_HAVE_CUDA_KERNELS && ME_TORCH_HAS_CUDA
  if (options_.mode == "delayed" && scale_.is_cuda()) {
    fp8_delayed_scale_update(history_.data_ptr<float>(), options_.history, next_, cast_amax().data_ptr<float>(),
                             scale_.data_ptr<float>(), static_cast<float>(target()),
                             c10::cuda::getCurrentCUDAStream().stream());
    next_ = (next_ + 1) % options_.history;
    seeded_ = true;
    return;
  }
#endif
  record(cast_amax().clone());
  cast_amax().zero_();
}

torch::Tensor Fp8Scale::state() const {
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(scale_.device());
  return torch::cat({scale_, torch::full({1}, static_cast<double>(next_), opts), history_});
}

void Fp8Scale::load_state(const torch::Tensor& state) {
  ME_CHECK(state.dim() == 1 && state.size(0) == options_.history + 2, "fp8 scaling state: expected ", options_.history + 2,
           " values (scale, next slot, ", options_.history, " amax), got ", state.sizes(),
           ": the checkpoint was written with another amax history length");
  const auto s = state.to(scale_.device(), torch::kFloat32);
  scale_.copy_(s.narrow(0, 0, 1));
  next_ = static_cast<int64_t>(s[1].item<float>());
  history_.copy_(s.narrow(0, 2, options_.history));
  seeded_ = true;
}

}  // namespace me::kernels
