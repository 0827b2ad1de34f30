#include "engine/kernels/fused_ops.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "engine/core/build_config.h"
#include "engine/core/error.h"

#if ME_HAVE_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "engine/kernels/kernels.h"
#endif

namespace me::kernels {

namespace {

const char* const kOpNames[] = {"swiglu",   "rotary",   "cross_entropy", "adamw",     "linear_bias",
                                "add_norm", "gemm_gelu", "chunk_gemm",   "wgrad_gemm"};
constexpr int kOps = 9;

// ME_KERNELS, read once: which kernels may run.
const std::vector<bool>& enabled_ops() {
  static const std::vector<bool> on = [] {
    std::vector<bool> v(kOps, true);
    const char* env = std::getenv("ME_KERNELS");
    if (!env || std::string(env).empty() || std::string(env) == "all") return v;
    v.assign(kOps, false);
    if (std::string(env) == "none") return v;
    std::stringstream ss(env);
    std::string name;
    while (std::getline(ss, name, ',')) {
      bool known = false;
      for (int i = 0; i < kOps; ++i)
        if (name == kOpNames[i]) v[static_cast<size_t>(i)] = known = true;
      ME_CHECK(known, "ME_KERNELS: unknown kernel '", name,
               "': expected all, none, or a comma list of swiglu, rotary, cross_entropy, adamw, linear_bias, ",
               "add_norm, gemm_gelu, chunk_gemm, wgrad_gemm");
    }
    return v;
  }();
  return on;
}

}  // namespace

bool compiled() { return ME_HAVE_CUDA_KERNELS != 0; }

bool use(Op op, const torch::Tensor& t) {
  return compiled() && t.defined() && t.is_cuda() &&
         (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kBFloat16) &&
         enabled_ops()[static_cast<size_t>(op)];
}

std::string describe() {
  if (!compiled()) return "none (built without nvcc or without CUDA LibTorch)";
  std::string s;
  for (int i = 0; i < kOps; ++i)
    if (enabled_ops()[static_cast<size_t>(i)]) s += (s.empty() ? "" : ", ") + std::string(kOpNames[i]);
  return s.empty() ? "none (ME_KERNELS=none)" : s;
}

#if ME_HAVE_CUDA_KERNELS

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

void* current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

DType dtype_of(const torch::Tensor& t) {
  if (t.scalar_type() == torch::kFloat) return DType::f32;
  ME_CHECK(t.scalar_type() == torch::kBFloat16, "fused kernels take fp32 or bf16 tensors, got ", t.scalar_type());
  return DType::bf16;
}

struct SwiGLUFn : public torch::autograd::Function<SwiGLUFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate_up) {
    auto in = gate_up.contiguous();
    auto sizes = in.sizes().vec();
    ME_CHECK(sizes.back() % 2 == 0, "swiglu: the last dimension (", sizes.back(), ") must hold (gate, up) pairs");
    sizes.back() /= 2;
    auto out = torch::empty(sizes, in.options());
    swiglu_forward(dtype_of(in), in.data_ptr(), out.data_ptr(), out.numel(), current_stream());
    ctx->save_for_backward({in});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto in = ctx->get_saved_variables()[0];
    const auto dy = grads[0].contiguous();
    auto dx = torch::empty_like(in);
    swiglu_backward(dtype_of(in), in.data_ptr(), dy.data_ptr(), dx.data_ptr(), dy.numel(), current_stream());
    return {dx};
  }
};

// Layout of rows [b, s, heads, d] (heads = groups x rep) in a tensor viewed as [b, s, heads, d].
RowLayout heads_layout(const torch::Tensor& t, int64_t groups, int64_t rep) {
  return {t.size(0), t.size(1), groups, rep, t.stride(0), t.stride(1), rep * t.stride(2), t.stride(2)};
}

// Layout of `rep` rows per group inside the fused QKV tensor viewed as [b, s, groups, rep + 2, d]
// (the queries: rep = heads / groups; a key or value: rep = 1), from the view's own strides.
RowLayout fused_layout(const torch::Tensor& t5, int64_t rep) {
  return {t5.size(0), t5.size(1), t5.size(2), rep, t5.stride(0), t5.stride(1), t5.stride(2), t5.stride(3)};
}

// The kernel's table pointer: empty tables mean no rotation.
const float* table(const torch::Tensor& t) { return t.numel() > 0 ? t.data_ptr<float>() : nullptr; }

// A gradient arriving as [b, heads, s, d] (in whatever layout attention's backward made) as
// rows [b, s, heads, d] with the last dimension contiguous, for the rotary kernel.
torch::Tensor as_rows(const torch::Tensor& g) {
  auto r = g.transpose(1, 2);
  return r.stride(-1) == 1 ? r : r.contiguous();
}

// Rows [b, s, heads, d] (heads = groups x rep) into their slots of the fused QKV gradient
// dx5 [b, s, groups, rep + 2, d] starting at `slot`, rotated back with tables (null: copied).
// The rotary kernel moves 16 bytes per access where LibTorch's strided copy_ moves 2.
void rows_into_fused(const torch::Tensor& rows, int64_t groups, int64_t rep, torch::Tensor& dx5, int64_t slot,
                     const float* cos_half, const float* sin_half) {
  rotary(dtype_of(rows), rows.data_ptr(), heads_layout(rows, groups, rep), dx5.select(3, slot).data_ptr(),
         fused_layout(dx5, rep), rows.size(-1), cos_half, sin_half, /*inverse=*/true, current_stream());
}

struct QKVRotaryFn : public torch::autograd::Function<QKVRotaryFn> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& qkv, int64_t groups, int64_t rep,
                               int64_t d, const torch::Tensor& cos_half, const torch::Tensor& sin_half) {
    const auto x = qkv.contiguous();
    const int64_t b = x.size(0), s = x.size(1), heads = groups * rep;
    ME_CHECK(cos_half.numel() == 0 || cos_half.size(0) >= s, "rotary tables cover ", cos_half.size(0),
             " positions, the input has ", s);
    const float *cs = table(cos_half), *sn = table(sin_half);
    auto x5 = x.view({b, s, groups, rep + 2, d});
    auto q = torch::empty({b, s, heads, d}, x.options());
    auto k = torch::empty({b, s, groups, d}, x.options());
    const DType t = dtype_of(x);
    rotary(t, x.data_ptr(), fused_layout(x5, rep), q.data_ptr(), heads_layout(q, groups, rep), d, cs, sn,
           /*inverse=*/false, current_stream());
    rotary(t, x5.select(3, rep).data_ptr(), fused_layout(x5, 1), k.data_ptr(), heads_layout(k, groups, 1), d, cs, sn,
           false, current_stream());
    auto v = x5.select(3, rep + 1);  // a strided view: SDPA reads it as it is (see QKVViewsFn)
    ctx->save_for_backward({cos_half, sin_half});
    ctx->saved_data["shape"] = x5.sizes().vec();
    return {q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // grads are never undefined here: LibTorch materialises an unused output's gradient as zeros.
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();  // [b, s, groups, rep + 2, d]
    const int64_t groups = shape[2], rep = shape[3] - 2, d = shape[4];
    auto dx5 = torch::empty(shape, grads[0].options());
    const float *cs = table(saved[0]), *sn = table(saved[1]);
    rows_into_fused(as_rows(grads[0]), groups, rep, dx5, 0, cs, sn);
    rows_into_fused(as_rows(grads[1]), groups, 1, dx5, rep, cs, sn);
    rows_into_fused(as_rows(grads[2]), groups, 1, dx5, rep + 1, nullptr, nullptr);
    return {dx5.view({shape[0], shape[1], -1}), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

// ME_NORM_BACKWARD_PASSES=1 or 2: the norm backward in one pass or two for every width, to
// measure the choice add_norm_backward makes by width and rows (unset: its choice).
NormBackwardPasses norm_backward_passes() {
  static const NormBackwardPasses passes = [] {
    const char* v = std::getenv("ME_NORM_BACKWARD_PASSES");
    const std::string s = v ? v : "";
    return s == "1" ? NormBackwardPasses::one : s == "2" ? NormBackwardPasses::two : NormBackwardPasses::automatic;
  }();
  return passes;
}

// Inputs {x, delta, weight} or {x, delta, weight, bias}; outputs {sum, y}. Saves the sum and
// the row statistics; backward gives x and delta the same gradient.
struct AddNormFn : public torch::autograd::Function<AddNormFn> {
  static variable_list forward(AutogradContext* ctx, at::TensorList in, double eps, bool rms) {
    const auto x = in[0].contiguous(), delta = in[1].contiguous();
    const auto& w = in[2];
    const auto b = in.size() > 3 ? in[3] : torch::Tensor();
    const int64_t hidden = x.size(-1), rows = x.numel() / hidden;
    auto sum = torch::empty_like(x), y = torch::empty_like(x);
    auto stats = x.options().dtype(torch::kFloat);
    auto mean = torch::empty({rms ? 0 : rows}, stats), rstd = torch::empty({rows}, stats);
    add_norm_forward(dtype_of(x), rms, x.data_ptr(), delta.data_ptr(), w.data_ptr(), b.defined() ? b.data_ptr() : nullptr,
                     sum.data_ptr(), y.data_ptr(), rms ? nullptr : mean.data_ptr<float>(), rstd.data_ptr<float>(), rows,
                     hidden, static_cast<float>(eps), current_stream());
    ctx->save_for_backward({sum, mean, rstd, w});
    ctx->set_materialize_grads(false);
    ctx->saved_data["rms"] = rms;
    ctx->saved_data["bias"] = b.defined();
    return {sum, y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &sum = saved[0], &mean = saved[1], &rstd = saved[2], &w = saved[3];
    const bool rms = ctx->saved_data["rms"].toBool(), has_bias = ctx->saved_data["bias"].toBool();
    // An unused output's gradient stays undefined (set_materialize_grads(false)): the final
    // norm's sum has none, which the kernel takes as no grad_sum rather than a zero-filled one.
    const auto d_sum = grads[0].defined() ? grads[0].contiguous() : torch::Tensor();
    const auto d_y = grads[1].defined() ? grads[1].contiguous() : torch::zeros_like(saved[0]);
    const int64_t hidden = sum.size(-1), rows = sum.numel() / hidden;
    auto grad_in = torch::empty_like(sum);
    auto stats = sum.options().dtype(torch::kFloat);
    // No rows: the kernel writes nothing, and the weight gradients are zero.
    auto make = [&] { return rows == 0 ? torch::zeros({hidden}, stats) : torch::empty({hidden}, stats); };
    auto gw = make(), gb = has_bias ? make() : torch::Tensor();
    auto scratch = torch::empty({add_norm_scratch_floats(rows, hidden)}, stats);
    add_norm_backward(dtype_of(sum), rms, d_y.data_ptr(), d_sum.defined() ? d_sum.data_ptr() : nullptr, sum.data_ptr(),
                      rms ? nullptr : mean.data_ptr<float>(), rstd.data_ptr<float>(), w.data_ptr(), grad_in.data_ptr(),
                      gw.data_ptr<float>(), has_bias ? gb.data_ptr<float>() : nullptr, scratch.data_ptr<float>(), rows,
                      hidden, current_stream(), norm_backward_passes());
    variable_list out{grad_in, grad_in, gw.to(w.scalar_type())};
    if (has_bias) out.push_back(gb.to(w.scalar_type()));
    out.push_back(torch::Tensor());  // eps
    out.push_back(torch::Tensor());  // rms
    return out;
  }
};

// Without RoPE and with one query head per key/value head (GPT): q, k and v are strided views
// of the QKV projection, no copies; SDPA reads them as they are (measured faster than
// contiguous copies on the H100, the copies' own time aside). Backward writes the QKV gradient
// once, where the views' own backward would zero-fill and sum three full-size tensors.
struct QKVViewsFn : public torch::autograd::Function<QKVViewsFn> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& qkv, int64_t heads, int64_t d) {
    auto x5 = qkv.view({qkv.size(0), qkv.size(1), heads, 3, d});
    ctx->saved_data["shape"] = x5.sizes().vec();
    return {x5.select(3, 0).transpose(1, 2), x5.select(3, 1).transpose(1, 2), x5.select(3, 2).transpose(1, 2)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto shape = ctx->saved_data["shape"].toIntVector();  // [b, s, heads, 3, d]
    auto dx5 = torch::empty(shape, grads[0].options());
    for (int64_t i = 0; i < 3; ++i)
      rows_into_fused(as_rows(grads[static_cast<size_t>(i)]), shape[2], 1, dx5, i, nullptr, nullptr);
    return {dx5.view({shape[0], shape[1], -1}), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool add_norm_fits(const torch::Tensor& x, const torch::Tensor& delta, const torch::Tensor& weight,
                   const torch::Tensor& bias) {
  auto like_weight = [&](const torch::Tensor& p) {  // the kernel reads it as x's type, on x's GPU
    return p.scalar_type() == x.scalar_type() && p.device() == x.device() && p.numel() == x.size(-1);
  };
  return x.dim() >= 1 && x.sizes() == delta.sizes() && x.scalar_type() == delta.scalar_type() &&
         delta.device() == x.device() && like_weight(weight) && (!bias.defined() || like_weight(bias)) &&
         add_norm_supported(x.size(-1));
}

AddNorm add_norm(const torch::Tensor& x, const torch::Tensor& delta, const torch::Tensor& weight,
                 const torch::Tensor& bias, double eps, bool rms) {
  const auto in = bias.defined() ? variable_list{x, delta, weight, bias} : variable_list{x, delta, weight};
  auto out = AddNormFn::apply(at::TensorList(in), eps, rms);  // a TensorList: see parallel::linear
  return {out[0], out[1]};
}

torch::Tensor swiglu(const torch::Tensor& gate_up) { return SwiGLUFn::apply(gate_up); }

QKV split_qkv(const torch::Tensor& qkv, int64_t groups, int64_t rep, int64_t head_dim,
                     const torch::Tensor& cos_half, const torch::Tensor& sin_half) {
  // A custom autograd function cannot take undefined tensors (LibTorch records each input's
  // device): "no rotation" travels as empty tables.
  if (!cos_half.defined() && rep == 1 && qkv.dim() == 3) {
    auto out = QKVViewsFn::apply(qkv, groups, head_dim);
    return {out[0], out[1], out[2]};
  }
  if (!cos_half.defined()) {
    const auto none = torch::empty({0}, qkv.options().dtype(torch::kFloat));
    return split_qkv(qkv, groups, rep, head_dim, none, none);
  }
  auto out = QKVRotaryFn::apply(qkv, groups, rep, head_dim, cos_half, sin_half);
  return {out[0], out[1], out[2]};
}

bool gemm_gelu_fits(const torch::Tensor& x, const torch::Tensor& w) {
  return x.is_cuda() && x.scalar_type() == torch::kBFloat16 && w.scalar_type() == torch::kBFloat16 && w.dim() == 2 &&
         x.size(-1) == w.size(1) && x.device() == w.device() && gemm_gelu_supported(w.size(1), w.size(0));
}

Activated linear_gelu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, const Activated& into) {
  const auto x2 = x.reshape({-1, x.size(-1)}).contiguous();
  const auto wc = w.contiguous(), bc = b.defined() ? b.contiguous() : b;
  auto sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  Activated a = into;
  if (a.pre.defined())
    ME_CHECK(a.pre.is_contiguous() && a.out.is_contiguous() && a.pre.numel() == x2.size(0) * w.size(0) &&
                 a.out.numel() == a.pre.numel(),
             "linear_gelu: outputs must be contiguous with ", x2.size(0), " x ", w.size(0), " elements");
  else
    a = {torch::empty(sizes, x.options()), torch::empty(sizes, x.options())};
  if (!gemm_bias_gelu(x2.data_ptr(), wc.data_ptr(), bc.defined() ? bc.data_ptr() : nullptr, a.pre.data_ptr(),
                      a.out.data_ptr(), x2.size(0), w.size(1), w.size(0), current_stream()))
    return {};
  return a;
}

namespace {
// chunk_gemm's operands: bf16 on the GPU, 2-D with unit stride along rows and 16-byte aligned rows
// (row strides and widths multiples of 8 elements, as cuBLASLt's vectorised kernels want).
bool chunk_rows_fit(const torch::Tensor& t) {
  return t.defined() && t.is_cuda() && t.scalar_type() == torch::kBFloat16 && t.dim() == 2 && t.stride(1) == 1 &&
         t.stride(0) % 8 == 0 && t.size(1) % 8 == 0 && t.stride(0) >= t.size(1);
}
bool chunk_weight_fits(const torch::Tensor& w, const torch::Tensor& b) {
  return chunk_rows_fit(w) && w.is_contiguous() &&
         (!b.defined() || (b.is_cuda() && b.scalar_type() == torch::kBFloat16 && b.dim() == 1 && b.is_contiguous() &&
                           b.size(0) == w.size(0)));
}
}  // namespace

bool linear_rows_into(const torch::Tensor& x2, const torch::Tensor& w, const torch::Tensor& b, const torch::Tensor& into) {
  if (!use(Op::chunk_gemm, x2) || !chunk_rows_fit(x2) || !chunk_rows_fit(into) || !chunk_weight_fits(w, b) ||
      x2.size(1) != w.size(1) || into.size(0) != x2.size(0) || into.size(1) != w.size(0))
    return false;
  return gemm_linear(x2.data_ptr(), x2.stride(0), w.data_ptr(), b.defined() ? b.data_ptr() : nullptr, into.data_ptr(),
                     into.stride(0), x2.size(0), w.size(1), w.size(0), current_stream());
}

bool input_grad_rows_into(const torch::Tensor& dy2, const torch::Tensor& w, const torch::Tensor& into) {
  if (!use(Op::chunk_gemm, dy2) || !chunk_rows_fit(dy2) || !chunk_rows_fit(into) || !chunk_weight_fits(w, {}) ||
      dy2.size(1) != w.size(0) || into.size(0) != dy2.size(0) || into.size(1) != w.size(1))
    return false;
  return gemm_input_grad(dy2.data_ptr(), dy2.stride(0), w.data_ptr(), into.data_ptr(), into.stride(0), dy2.size(0),
                         w.size(0), w.size(1), current_stream());
}

bool weight_grad_into(const torch::Tensor& main, const torch::Tensor& dy2, const torch::Tensor& x2, bool accumulate) {
  if (!use(Op::wgrad_gemm, dy2) || !chunk_rows_fit(dy2) || !chunk_rows_fit(x2) || dy2.size(0) != x2.size(0) ||
      !main.defined() || main.device() != dy2.device() || main.dim() != 2 || !main.is_contiguous() ||
      (main.scalar_type() != torch::kFloat && main.scalar_type() != torch::kBFloat16) ||
      main.size(0) != dy2.size(1) || main.size(1) != x2.size(1))
    return false;
  return gemm_weight_grad(dy2.data_ptr(), dy2.stride(0), x2.data_ptr(), x2.stride(0), main.data_ptr(),
                          main.scalar_type() == torch::kFloat ? DType::f32 : DType::bf16, dy2.size(0), dy2.size(1),
                          x2.size(1), accumulate, current_stream());
}

torch::Tensor matmul_dgelu(const torch::Tensor& grad_out, const torch::Tensor& w, const torch::Tensor& pre,
                           const torch::Tensor& into) {
  const auto dy = grad_out.reshape({-1, w.size(0)}).contiguous();
  const auto wc = w.contiguous(), p = pre.contiguous();
  if (into.defined())
    ME_CHECK(into.is_contiguous() && into.numel() == p.numel(), "matmul_dgelu: the output must be contiguous with ",
             p.numel(), " elements");
  auto grad_pre = into.defined() ? into : torch::empty_like(p);
  if (!gemm_dgelu(dy.data_ptr(), wc.data_ptr(), p.data_ptr(), grad_pre.data_ptr(), dy.size(0), w.size(0), w.size(1),
                  current_stream()))
    return {};
  return grad_pre;
}

RowStats cross_entropy_stats(const torch::Tensor& logits, const torch::Tensor& labels, int64_t vocab_start,
                             int64_t real) {
  ME_CHECK(logits.dim() == 2 && logits.is_contiguous(), "cross_entropy_stats: logits must be contiguous [rows, vocab]");
  const int64_t rows = logits.size(0);
  auto opts = logits.options().dtype(torch::kFloat);
  RowStats s{torch::empty({rows}, opts), torch::empty({rows}, opts), torch::empty({rows}, opts)};
  const auto l = labels.to(torch::kLong).contiguous();
  kernels::cross_entropy_stats(dtype_of(logits), logits.data_ptr(), rows, logits.size(1), real,
                               l.data_ptr<int64_t>(), vocab_start, s.max.data_ptr<float>(), s.sum_exp.data_ptr<float>(),
                               s.target.data_ptr<float>(), current_stream());
  return s;
}

void cross_entropy_backward_(torch::Tensor& logits, const torch::Tensor& labels, int64_t vocab_start, int64_t real,
                             const torch::Tensor& lse, const torch::Tensor& grad_row) {
  ME_CHECK(logits.dim() == 2 && logits.is_contiguous(), "cross_entropy_backward_: logits must be contiguous [rows, vocab]");
  const auto l = labels.to(torch::kLong).contiguous();
  const auto lse32 = lse.to(torch::kFloat).contiguous(), g32 = grad_row.to(torch::kFloat).contiguous();
  cross_entropy_backward(dtype_of(logits), logits.data_ptr(), logits.data_ptr(), logits.size(0), logits.size(1), real,
                         l.data_ptr<int64_t>(), vocab_start, lse32.data_ptr<float>(), g32.data_ptr<float>(),
                         current_stream());
}

MultiTensorAdamW::MultiTensorAdamW(const std::vector<Entry>& entries) {
  std::vector<OptimTensor> table;
  for (const auto& e : entries) {
    for (const auto* t : {&e.master, &e.grad, &e.exp_avg, &e.exp_avg_sq})
      ME_CHECK(t->is_cuda() && (t->scalar_type() == torch::kFloat || (t == &e.grad && t->scalar_type() == torch::kBFloat16)) &&
                   t->is_contiguous() && t->numel() == e.master.numel(),
               "MultiTensorAdamW: master, grad and moments must be contiguous CUDA tensors of one size, fp32 (the ",
               "grad may be bf16)");
    uint16_t* model = nullptr;
    if (e.model.defined()) {
      ME_CHECK(e.model.scalar_type() == torch::kBFloat16 && e.model.is_contiguous() && e.model.numel() == e.master.numel(),
               "MultiTensorAdamW: the model copy must be a contiguous bf16 tensor of the master's size");
      model = reinterpret_cast<uint16_t*>(e.model.data_ptr());
    }
    table.push_back({e.master.data_ptr<float>(), e.grad.data_ptr(), e.exp_avg.data_ptr<float>(),
                     e.exp_avg_sq.data_ptr<float>(), model, e.master.numel(), static_cast<float>(e.weight_decay),
                     e.in_norm ? 1 : 0, e.grad.scalar_type() == torch::kBFloat16 ? 1 : 0});
  }
  const auto chunks = make_chunks(table);
  num_chunks_ = static_cast<int64_t>(chunks.size());
  const auto device = entries.empty() ? torch::Device(torch::kCUDA) : entries.front().master.device();
  auto to_device = [&](const void* data, size_t bytes) {
    auto host = torch::empty({static_cast<int64_t>(bytes)}, torch::kUInt8);
    std::memcpy(host.data_ptr(), data, bytes);
    return host.to(device);
  };
  table_ = to_device(table.data(), table.size() * sizeof(OptimTensor));
  chunks_ = to_device(chunks.data(), chunks.size() * sizeof(OptimChunk));
  partials_ = torch::empty({std::max<int64_t>(1, num_chunks_)}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  out_ = torch::zeros({1}, partials_.options());
}

torch::Tensor MultiTensorAdamW::grad_sum_squares() {
  kernels::grad_sum_squares(reinterpret_cast<const OptimTensor*>(table_.data_ptr()),
                            reinterpret_cast<const OptimChunk*>(chunks_.data_ptr()), num_chunks_,
                            partials_.data_ptr<double>(), out_.data_ptr<double>(), current_stream());
  return out_;
}

void MultiTensorAdamW::step(double lr, double beta1, double beta2, double eps, int64_t step, double grad_scale) {
  AdamWStep s{};
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.eps = static_cast<float>(eps);
  s.bias_correction1 = static_cast<float>(1.0 - std::pow(beta1, static_cast<double>(step)));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step))));
  s.grad_scale = static_cast<float>(grad_scale);
  kernels::adamw(reinterpret_cast<const OptimTensor*>(table_.data_ptr()),
                 reinterpret_cast<const OptimChunk*>(chunks_.data_ptr()), num_chunks_, s, current_stream());
}

#else  // built without the CUDA kernels: use() is false, so none of these is reached

namespace {
[[noreturn]] void not_compiled(const char* what) {
  ::me::fail(what, ": this build has no CUDA kernels (check kernels::use() first)");
}
}  // namespace

torch::Tensor swiglu(const torch::Tensor&) { not_compiled("swiglu"); }
bool add_norm_fits(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) {
  return false;
}
AddNorm add_norm(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, double, bool) {
  not_compiled("add_norm");
}
QKV split_qkv(const torch::Tensor&, int64_t, int64_t, int64_t, const torch::Tensor&, const torch::Tensor&) {
  not_compiled("split_qkv");
}
RowStats cross_entropy_stats(const torch::Tensor&, const torch::Tensor&, int64_t, int64_t) {
  not_compiled("cross_entropy_stats");
}
void cross_entropy_backward_(torch::Tensor&, const torch::Tensor&, int64_t, int64_t, const torch::Tensor&,
                             const torch::Tensor&) {
  not_compiled("cross_entropy_backward_");
}
bool gemm_gelu_fits(const torch::Tensor&, const torch::Tensor&) { return false; }
void set_gemm_sm_count_target(int) {}
Activated linear_gelu(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const Activated&) {
  not_compiled("linear_gelu");
}
torch::Tensor matmul_dgelu(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) {
  not_compiled("matmul_dgelu");
}
// Never taken without the kernels: the callers fall back to LibTorch's mm.
bool linear_rows_into(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) {
  return false;
}
bool input_grad_rows_into(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&) { return false; }
bool weight_grad_into(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, bool) { return false; }
std::string gemm_autotune_summary() { return {}; }
size_t gemm_autotune_settled() { return 0; }
MultiTensorAdamW::MultiTensorAdamW(const std::vector<Entry>&) { not_compiled("MultiTensorAdamW"); }
torch::Tensor MultiTensorAdamW::grad_sum_squares() { not_compiled("MultiTensorAdamW"); }
void MultiTensorAdamW::step(double, double, double, double, int64_t, double) { not_compiled("MultiTensorAdamW"); }

#endif

}  // namespace me::kernels
