#include "engine/kernels/fp8_linear.h"

#include "engine/core/build_config.h"  // ME_HAVE_CUDA_KERNELS
#include "engine/core/error.h"
#include "engine/core/torch_compat.h"

#if ME_HAS_SCALED_MM && ME_HAVE_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "engine/kernels/kernels.h"
#define ME_FP8_GEMMS 1
#else
#define ME_FP8_GEMMS 0
#endif

namespace me::kernels {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Fp8LinearScales::Fp8LinearScales(const Fp8ScalingOptions& options, const torch::Device& device)
    : input(Fp8::e4m3, options, device), weight(Fp8::e4m3, options, device), grad_output(Fp8::e5m2, options, device) {}

torch::Tensor Fp8LinearScales::state() const { return torch::cat({input.state(), weight.state(), grad_output.state()}); }

void Fp8LinearScales::load_state(const torch::Tensor& state) {
  const int64_t n = input.state().numel();
  ME_CHECK(state.dim() == 1 && state.numel() == 3 * n, "fp8 linear scales: expected 3 x ", n, " values, got ",
           state.sizes());
  input.load_state(state.narrow(0, 0, n));
  weight.load_state(state.narrow(0, n, n));
  grad_output.load_state(state.narrow(0, 2 * n, n));
}

bool fp8_gemm_compiled() { return ME_FP8_GEMMS != 0; }

Fp8Tensor fp8_cast(const torch::Tensor& x, Fp8Scale& s, bool transposed) {
  ME_CHECK(x.dim() == 2, "fp8_cast: expected a 2-D tensor, got shape ", x.sizes());
  const auto scale = s.scale_for(x);  // current scaling: from x's amax, now
#if ME_FP8_GEMMS
  if (x.is_cuda()) {
    const auto in = x.contiguous();
    ME_CHECK(in.scalar_type() == torch::kBFloat16 || in.scalar_type() == torch::kFloat32,
             "fp8_cast: expected bf16 or float32, got ", in.scalar_type());
    const int64_t rows = in.size(0), cols = in.size(1);
    const auto bytes = in.options().dtype(torch::kByte);
    auto out = torch::empty({rows, cols}, bytes);
    auto out_t = transposed ? torch::empty({cols, rows}, bytes) : torch::Tensor();
    auto amax = torch::zeros({1}, in.options().dtype(torch::kFloat32));
    fp8_cast_transpose(in.scalar_type() == torch::kBFloat16 ? DType::bf16 : DType::f32, s.format(), in.data_ptr(), rows,
                       cols, scale.data_ptr<float>(), out.data_ptr<uint8_t>(),
                       transposed ? out_t.data_ptr<uint8_t>() : nullptr, amax.data_ptr<float>(),
                       c10::cuda::getCurrentCUDAStream().stream());
    Fp8Tensor r{out.view(compat::float8_dtype(s.format() == Fp8::e5m2)), torch::Tensor(), scale.reciprocal()};
    if (transposed) r.data_t = out_t.view(r.data.scalar_type());
    if (s.delayed()) s.record(amax);
    return r;
  }
#endif
  Fp8Tensor r{fp8_round(x.to(torch::kFloat32) * scale, s.format()), torch::Tensor(), scale.reciprocal()};
  if (transposed) r.data_t = r.data.t().contiguous();
  if (s.delayed()) s.record(x.detach().abs().max().to(torch::kFloat32).reshape({1}));
  return r;
}

torch::Tensor fp8_gemm_nt(const torch::Tensor& a, const torch::Tensor& a_scale_inv, const torch::Tensor& b,
                          const torch::Tensor& b_scale_inv, torch::ScalarType out) {
  ME_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1), "fp8_gemm_nt: expected a [m, k] and b [n, k], got ",
           a.sizes(), " and ", b.sizes());
#if ME_FP8_GEMMS
  if (a.is_cuda()) return compat::scaled_mm(a, b.t(), a_scale_inv, b_scale_inv, out);
#endif
  return (torch::mm(a, b.t()) * (a_scale_inv * b_scale_inv)).to(out);
}

namespace {

void check_aligned(int64_t n, const char* what) {
  ME_CHECK(n % 16 == 0, "precision = \"fp8\": ", what, " is ", n,
           "; fp8 GEMMs need multiples of 16 (the model's widths, and batch.micro x model.seq)");
}

struct Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList in, Fp8LinearScales* scales) {
    const auto &x = in[0], &w = in[1];
    const auto b = in.size() > 2 ? in[2] : torch::Tensor();
    const auto x2 = x.reshape({-1, x.size(-1)});
    check_aligned(x2.size(0), "the number of rows (tokens) of a linear layer's input");
    check_aligned(w.size(0), "a linear layer's output width");
    check_aligned(w.size(1), "a linear layer's input width");
    // The transposed copies are what the backward's GEMMs read (x^T for dW, W^T for dx): the
    // fp8 input is saved instead of the bf16 one, at half its bytes.
    const auto qx = fp8_cast(x2, scales->input, /*transposed=*/true);
    const auto qw = fp8_cast(w, scales->weight, /*transposed=*/true);
    auto y = fp8_gemm_nt(qx.data, qx.scale_inv, qw.data, qw.scale_inv, x.scalar_type());
    if (b.defined()) y.add_(b);
    ctx->save_for_backward({qx.data_t, qx.scale_inv, qw.data_t, qw.scale_inv});
    ctx->saved_data["scales"] = reinterpret_cast<int64_t>(scales);
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["has_bias"] = b.defined();
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w.scalar_type());
    auto sizes = x.sizes().vec();
    sizes.back() = w.size(0);
    return {y.view(sizes)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x_t = saved[0], &x_scale_inv = saved[1], &w_t = saved[2], &w_scale_inv = saved[3];
    auto* scales = reinterpret_cast<Fp8LinearScales*>(ctx->saved_data["scales"].toInt());
    const auto dy = grads[0].reshape({-1, grads[0].size(-1)}).contiguous();
    const auto qdy = fp8_cast(dy, scales->grad_output, /*transposed=*/true);
    const auto x_sizes = ctx->saved_data["x_sizes"].toIntVector();
    auto dx = fp8_gemm_nt(qdy.data, qdy.scale_inv, w_t, w_scale_inv, grads[0].scalar_type()).view(x_sizes);
    const auto w_dtype = static_cast<torch::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    auto dw = fp8_gemm_nt(qdy.data_t, qdy.scale_inv, x_t, x_scale_inv, w_dtype);
    auto db = ctx->saved_data["has_bias"].toBool() ? dy.sum(0) : torch::Tensor();
    return {dx, dw, db, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                         Fp8LinearScales& scales) {
  const auto in = b.defined() ? variable_list{x, w, b} : variable_list{x, w};
  // As a TensorList: a std::vector would be taken for a non-tensor argument (no gradient).
  return Fp8LinearFunction::apply(at::TensorList(in), &scales)[0];
}

}  // namespace me::kernels
