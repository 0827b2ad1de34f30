#include "engine/kernels/fp8_linear.h"

#include "engine/core/build_config.h"  // ME_HAVE_CUDA_KERNELS
#include "engine/core/error.h"
#include "engine/core/torch_compat.h"

#if ME_HAVE_CUDA_KERNELS && ME_TORCH_HAS_CUDA
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

namespace {
thread_local Fp8RecomputeTape* tape_now = nullptr;
thread_local Fp8RecomputeTape::Mode tape_mode = Fp8RecomputeTape::Mode::record;
}  // namespace

Fp8RecomputeTape::Scope::Scope(Fp8RecomputeTape& tape, Mode mode) : previous_(tape_now), previous_mode_(tape_mode) {
  tape_now = &tape;
  tape_mode = mode;
}

Fp8RecomputeTape::Scope::~Scope() {
  tape_now = previous_;
  tape_mode = previous_mode_;
}

Fp8RecomputeTape* Fp8RecomputeTape::current(Mode* mode) {
  *mode = tape_mode;
  return tape_now;
}

torch::Tensor Fp8RecomputeTape::record(Fp8Scale& s, const torch::Tensor& scale) {
  // a copy: a delayed scale is updated in place right after the cast
  return scales_[&s].emplace_back(scale.clone());
}

torch::Tensor Fp8RecomputeTape::replay(const Fp8Scale& s) {
  const auto it = scales_.find(&s);
  if (it == scales_.end() || it->second.empty()) return {};
  auto scale = std::move(it->second.front());
  it->second.pop_front();
  return scale;
}

Fp8Tensor fp8_cast(const torch::Tensor& x, Fp8Scale& s, bool transposed, bool gelu) {
  ME_CHECK(x.dim() == 2, "fp8_cast: expected a 2-D tensor, got shape ", x.sizes());
  if (gelu && !(ME_FP8_GEMMS && x.is_cuda() && s.delayed() && s.seeded()))
    return fp8_cast(torch::gelu(x, "tanh"), s, transposed);  // the scale reads gelu(x), or no fused kernel
  // Only delayed scales move between a forward and its recomputation: a current one is x's own.
  auto mode = Fp8RecomputeTape::Mode::record;
  auto* tape = s.delayed() ? Fp8RecomputeTape::current(&mode) : nullptr;
  const bool replayed = tape && mode == Fp8RecomputeTape::Mode::replay;
  torch::Tensor scale = replayed ? tape->replay(s) : torch::Tensor();
  const bool record_amax = !scale.defined();
  if (!scale.defined()) scale = s.scale_for(x);  // current scaling: from x's amax, now
  if (tape && !replayed) tape->record(s, scale);
#if ME_FP8_GEMMS
  if (x.is_cuda()) {
    const auto in = x.contiguous();
    ME_CHECK(in.scalar_type() == torch::kBFloat16 || in.scalar_type() == torch::kFloat32,
             "fp8_cast: expected bf16 or float32, got ", in.scalar_type());
    const int64_t rows = in.size(0), cols = in.size(1);
    const auto bytes = in.options().dtype(torch::kByte);
    // scale_inv: this cast's own (the kernel writes it), since the scale moves on right after
    Fp8Tensor r{torch::empty({rows, cols}, bytes), transposed ? torch::empty({cols, rows}, bytes) : torch::Tensor(),
                torch::empty({1}, scale.options()), s.format()};
    fp8_cast_transpose(in.scalar_type() == torch::kBFloat16 ? DType::bf16 : DType::f32, s.format(), in.data_ptr(), rows,
                       cols, scale.data_ptr<float>(), r.data.data_ptr<uint8_t>(),
                       transposed ? r.data_t.data_ptr<uint8_t>() : nullptr,
                       (record_amax ? s.cast_amax() : torch::zeros({1}, scale.options())).data_ptr<float>(),
                       r.scale_inv.data_ptr<float>(), c10::cuda::getCurrentCUDAStream().stream(), gelu);
    if (s.delayed() && record_amax) s.record_cast_amax();
    return r;
  }
#endif
  ME_CHECK(!gelu, "fp8_cast: GeLU is fused into the GPU cast only");  // (formed first above, elsewhere)
  Fp8Tensor r{fp8_round(x.to(torch::kFloat32) * scale, s.format()), torch::Tensor(), scale.reciprocal(), s.format()};
  if (transposed) r.data_t = r.data.t().contiguous();
  if (s.delayed() && record_amax) s.record(x.detach().abs().max().to(torch::kFloat32).reshape({1}));
  return r;
}

namespace {

void check_operands(const Fp8Matrix& a, const Fp8Matrix& b) {
  ME_CHECK(a.data.dim() == 2 && b.data.dim() == 2 && a.data.size(1) == b.data.size(1),
           "fp8 GEMM: expected a [m, k] and b [n, k], got ", a.data.sizes(), " and ", b.data.sizes());
}

#if ME_FP8_GEMMS
Fp8Operand operand(const Fp8Matrix& m) {
  ME_CHECK(m.data.is_contiguous() && m.data.scalar_type() == torch::kByte, "fp8 GEMM: expected contiguous fp8 bytes");
  return {m.data.data_ptr(), m.format, m.scale_inv.data_ptr<float>()};
}

// d (+)= a b^T on the fp8 tensor cores; an error naming the shape where cuBLASLt has no kernel.
void gpu_gemm(const Fp8Matrix& a, const Fp8Matrix& b, const torch::Tensor& bias, torch::Tensor& d, bool accumulate,
              bool fast_accum) {
  ME_CHECK(d.is_contiguous() && (d.scalar_type() == torch::kFloat32 || d.scalar_type() == torch::kBFloat16),
           "fp8 GEMM: the output must be contiguous float32 or bf16, got ", d.scalar_type());
  const int64_t m = a.data.size(0), n = b.data.size(0), k = a.data.size(1);
  ME_CHECK(gemm_fp8(operand(a), operand(b), bias.defined() ? bias.data_ptr() : nullptr,
                    d.scalar_type() == torch::kFloat32 ? DType::f32 : DType::bf16, d.data_ptr(), m, n, k, accumulate,
                    fast_accum, c10::cuda::getCurrentCUDAStream().stream()),
           "fp8 GEMM: cuBLASLt offers no kernel for [", m, ", ", k, "] x [", n, ", ", k, "]^T into ", d.scalar_type(),
           " (the dimensions must be multiples of 16)");
}
#endif

}  // namespace

torch::Tensor fp8_gemm_nt(const Fp8Matrix& a, const Fp8Matrix& b, torch::ScalarType out, const torch::Tensor& bias,
                          bool fast_accum) {
  check_operands(a, b);
#if ME_FP8_GEMMS
  if (a.data.is_cuda()) {
    auto d = torch::empty({a.data.size(0), b.data.size(0)}, a.data.options().dtype(out));
    // cuBLASLt's bias has the output's type: in the epilogue for bf16 outputs, else added after.
    const bool in_epilogue = bias.defined() && out == torch::kBFloat16 && bias.scalar_type() == out && bias.is_contiguous();
    gpu_gemm(a, b, in_epilogue ? bias : torch::Tensor(), d, false, fast_accum);
    if (bias.defined() && !in_epilogue) d.add_(bias);
    return d;
  }
#endif
  (void)fast_accum;
  auto d = torch::mm(a.data, b.data.t()) * (a.scale_inv * b.scale_inv);
  if (bias.defined()) d.add_(bias.to(d.scalar_type()));
  return d.to(out);
}

void fp8_gemm_nt_into(torch::Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b, bool accumulate) {
  check_operands(a, b);
  ME_CHECK(out.dim() == 2 && out.size(0) == a.data.size(0) && out.size(1) == b.data.size(0), "fp8 GEMM: output ",
           out.sizes(), " for a product [", a.data.size(0), ", ", b.data.size(0), "]");
#if ME_FP8_GEMMS
  if (a.data.is_cuda()) return gpu_gemm(a, b, torch::Tensor(), out, accumulate, false);
#endif
  const auto d = torch::mm(a.data, b.data.t()) * (a.scale_inv * b.scale_inv);
  accumulate ? out.add_(d) : out.copy_(d);
}

void check_fp8_aligned(int64_t n, const char* what) {
  ME_CHECK(n % 16 == 0, "precision = \"fp8\": ", what, " is ", n,
           "; fp8 GEMMs need multiples of 16 (the model's widths, and batch.micro x model.seq)");
}

Fp8Linear::Fp8Linear(const Fp8Model& model, const torch::Device& device)
    : scales(model.scaling, device), model_(&model) {}

const Fp8Tensor& Fp8Linear::weight(const torch::Tensor& w) {
  if (weight_version_ != model_->weights_version || weight_data_ != w.data_ptr()) {
    torch::NoGradGuard no_grad;
    weight_ = fp8_cast(w.detach(), scales.weight, /*transposed=*/true);
    weight_version_ = model_->weights_version;
    weight_data_ = w.data_ptr();
  }
  return weight_;
}

namespace {

struct Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList in, Fp8LinearScales* scales) {
    const auto &x = in[0], &w = in[1];
    const auto b = in.size() > 2 ? in[2] : torch::Tensor();
    const auto x2 = x.reshape({-1, x.size(-1)});
    check_fp8_aligned(x2.size(0), "the number of rows (tokens) of a linear layer's input");
    check_fp8_aligned(w.size(0), "a linear layer's output width");
    check_fp8_aligned(w.size(1), "a linear layer's input width");
    // The transposed copies are what the backward's GEMMs read (x^T for dW, W^T for dx): the
    // fp8 input is saved instead of the bf16 one, at half its bytes.
    const auto qx = fp8_cast(x2, scales->input, /*transposed=*/true);
    const auto qw = fp8_cast(w, scales->weight, /*transposed=*/true);
    auto y = fp8_gemm_nt(qx.matrix(), qw.matrix(), x.scalar_type(), b, /*fast_accum=*/true);
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
    auto dx = fp8_gemm_nt(qdy.matrix(), {w_t, w_scale_inv, Fp8::e4m3}, grads[0].scalar_type()).view(x_sizes);
    const auto w_dtype = static_cast<torch::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    auto dw = fp8_gemm_nt(qdy.transposed(), {x_t, x_scale_inv, Fp8::e4m3}, w_dtype);
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
