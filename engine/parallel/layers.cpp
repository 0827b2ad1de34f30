#include "engine/parallel/layers.h"

#include "engine/core/autograd_state.h"
#include "engine/core/error.h"
#include "engine/core/torch_compat.h"
#include "engine/kernels/fused_ops.h"
#include "engine/parallel/collective_matmul.h"
#include "engine/parallel/mappings.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <tuple>

namespace me::parallel {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {
int64_t divide(int64_t n, int64_t parts, const char* what) {
  ME_CHECK(n % parts == 0, what, " (", n, ") is not divisible by the tensor-parallel size ", parts);
  return n / parts;
}
}  // namespace

void attach_main_grads(torch::nn::Module& model, MainGradSink* sink) {
  for (auto& m : model.modules()) {
    if (auto* column = dynamic_cast<ColumnParallelLinearImpl*>(m.get())) column->main_grads = sink;
    if (auto* row = dynamic_cast<RowParallelLinearImpl*>(m.get())) row->main_grads = sink;
    if (auto* embedding = dynamic_cast<VocabParallelEmbeddingImpl*>(m.get())) {
      embedding->main_grads = sink;
      embedding->main_grads_first_part = sink ? std::make_shared<FirstPartOf>(sink) : nullptr;
    }
  }
}

void attach_fp8(torch::nn::Module& model, const kernels::Fp8Model* fp8) {
  auto layer = [fp8](const torch::Tensor& w) {
    return fp8 ? std::make_shared<kernels::Fp8Linear>(*fp8, w.device()) : nullptr;
  };
  for (auto& m : model.named_modules()) {
    if (m.key().rfind("blocks.", 0) != 0) continue;  // not the output layer
    if (auto* column = m.value()->as<ColumnParallelLinearImpl>()) column->fp8 = layer(column->weight);
    if (auto* row = m.value()->as<RowParallelLinearImpl>()) row->fp8 = layer(row->weight);
  }
}

std::vector<kernels::Fp8Linear*> fp8_layers(const torch::nn::Module& model) {
  std::vector<kernels::Fp8Linear*> out;
  for (auto& m : model.modules()) {
    if (auto* column = m->as<ColumnParallelLinearImpl>(); column && column->fp8) out.push_back(column->fp8.get());
    if (auto* row = m->as<RowParallelLinearImpl>(); row && row->fp8) out.push_back(row->fp8.get());
  }
  return out;
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in, int64_t out, bool with_bias, TensorParallel tp,
                                                   bool gather_output)
    : in_(in), out_(out), tp_(tp), gather_output_(gather_output) {
  const int64_t local = divide(out, tp.size(), "output features of a column-parallel layer");
  weight = register_parameter("weight", torch::empty({local, in}));
  if (with_bias) bias = register_parameter("bias", torch::zeros({local}));
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) { return forward_with(x, weight); }

kernels::Activated ColumnParallelLinearImpl::forward_gelu(const torch::Tensor& x) {
  ME_CHECK(!gather_output_, "forward_gelu: a column-parallel layer gathering its output feeds no row-parallel one");
  // fp8: composed (cuBLASLt's fp8 GeLU epilogues measured slower than a GEMM plus GeLU on the H100)
  if (fp8 || !kernels::use(kernels::Op::gemm_gelu, x) || !kernels::gemm_gelu_fits(x, weight)) return {forward(x), {}};
  return linear_gelu(x, weight, bias, LinearComm::column(tp_, main_grads));
}

torch::Tensor ColumnParallelLinearImpl::forward_with(const torch::Tensor& x, const torch::Tensor& w) {
  // A weight owned elsewhere also gets gradients elsewhere: autograd sums them, not the sink.
  const bool own = w.is_same(weight);
  auto y = linear(x, w, bias, LinearComm::column(tp_, own ? main_grads : nullptr, own ? fp8.get() : nullptr));
  return gather_output_ ? gather_last(y, tp_) : y;
}

std::vector<std::pair<std::string, ShardInfo>> ColumnParallelLinearImpl::shards() const {
  std::vector<std::pair<std::string, ShardInfo>> s{{"weight", {{out_, in_}, 0, false}}};
  if (bias.defined()) s.push_back({"bias", {{out_}, 0, false}});
  return s;
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in, int64_t out, bool with_bias, TensorParallel tp)
    : in_(in), out_(out), tp_(tp) {
  const int64_t local = divide(in, tp.size(), "input features of a row-parallel layer");
  weight = register_parameter("weight", torch::empty({out, local}));
  if (with_bias) bias = register_parameter("bias", torch::zeros({out}));
}

// Under sequence parallelism the reduce-scatter happens inside the GEMM's function (overlapped
// with it), which adds the bias once after it and takes its gradient with the weight's (one
// autograd node, no separate add and sum); without, the partial products are all-reduced after
// it and the bias added after that.
torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) { return forward_product(x, linear); }

torch::Tensor RowParallelLinearImpl::forward_product(const torch::Tensor& x, LinearFn product) {
  // Nothing to reduce: the bias can join the GEMM.
  if (!tp_.active()) return product(x, weight, bias, LinearComm::local(main_grads, fp8.get()));
  if (tp_.sequence_parallel) return product(x, weight, bias, LinearComm::row(tp_, main_grads, fp8.get()));
  return add_bias(reduce_from_tp(product(x, weight, {}, LinearComm::local(main_grads, fp8.get())), tp_));
}

torch::Tensor RowParallelLinearImpl::forward_gelu(const kernels::Activated& a) {
  if (!a.out.defined() && fp8) return forward_product(a.pre, linear_of_gelu);  // GeLU inside the fp8 cast
  if (!a.out.defined()) return forward(torch::gelu(a.pre, "tanh"));
  if (!tp_.active()) return gelu_linear(a, weight, bias, LinearComm::local(main_grads));
  if (tp_.sequence_parallel) return gelu_linear(a, weight, bias, LinearComm::row(tp_, main_grads));
  return add_bias(reduce_from_tp(gelu_linear(a, weight, {}, LinearComm::local(main_grads)), tp_));
}

torch::Tensor RowParallelLinearImpl::add_bias(const torch::Tensor& y) { return bias.defined() ? y + bias : y; }

std::vector<std::pair<std::string, ShardInfo>> RowParallelLinearImpl::shards() const {
  std::vector<std::pair<std::string, ShardInfo>> s{{"weight", {{out_, in_}, 1, false}}};
  if (bias.defined()) s.push_back({"bias", {{out_}, -1, tp_.sequence_parallel && tp_.active()}});
  return s;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t vocab, int64_t hidden, TensorParallel tp)
    : vocab_(vocab), hidden_(hidden), tp_(tp) {
  local_ = divide(vocab, tp.size(), "the padded vocabulary");
  start_ = local_ * tp.rank();
  weight = register_parameter("weight", torch::empty({local_, hidden}));
}

namespace {
// weight[ids] whose backward adds the rows' gradients into the weight's main grad, sorted by id
// (LibTorch's accumulating index_put: deterministic), instead of autograd's dense gradient: that
// is a zero-filled [vocab, hidden] tensor per micro-batch, then added into the main grad, three
// passes over the whole table (measured 8% of a 2-layer GPT-39B-width step on the H100).
struct EmbeddingMainGrad : public torch::autograd::Function<EmbeddingMainGrad> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& weight, const torch::Tensor& ids,
                               MainGradSink* sink) {
    ctx->save_for_backward({weight, ids});
    save_state(ctx, "sink", sink);
    return torch::embedding(weight, ids);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &weight = saved[0], &ids = saved[1];
    auto* sink = saved_state<MainGradSink*>(ctx, "sink");
    if (!grads[0].defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
    bool accumulate = false;
    auto main = sink->main_grad(weight, &accumulate);
    DelayedWeightGrad::fence();  // a tied head's weight gradient may still be running on its own stream
    const auto rows = grads[0].reshape({-1, weight.size(1)}).to(main.scalar_type());
    if (!accumulate) main.zero_();
    main.index_put_({ids.reshape({-1})}, rows, /*accumulate=*/true);
    sink->mark_written(weight);
    return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// weight[ids], its gradient into the main grads where they hold the weight.
torch::Tensor lookup(const torch::Tensor& weight, const torch::Tensor& ids, MainGradSink* sink) {
  bool accumulate = false;
  if (!sink || !torch::GradMode::is_enabled() || !weight.requires_grad() || !sink->main_grad(weight, &accumulate).defined())
    return torch::embedding(weight, ids);
  return EmbeddingMainGrad::apply(weight, ids, sink);
}
}  // namespace

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& tokens) {
  if (!tp_.active()) return lookup(weight, tokens, main_grads);
  // Ids outside this rank's range look up some row and are zeroed: the all-reduce then sums
  // exactly one real row per id. Their gradient rows are zero, added into the rows they looked
  // up: (id - start) mod rows spreads them over the table as the ids are spread (an id inside
  // the range is its own row), not all on row 0, where the accumulating index_put added them one
  // after another (at tp 4, 3/4 of the tokens: 1.4 ms a micro-batch at GPT-39B width on the
  // H100, session 24's traces). x + 0 is x: the sums keep their bits.
  auto outside = (tokens < start_) | (tokens >= start_ + local_);
  auto local_ids = (tokens - start_).remainder(local_);  // LibTorch's remainder: never negative
  // The lookup's result is a tensor of its own: zeroed in place, not copied (32 MiB at GPT-39B width).
  auto partial = lookup(weight, local_ids, main_grads).masked_fill_(outside.unsqueeze(-1), 0.0);
  return tp_.sequence_parallel ? reduce_scatter_seq(partial, tp_) : reduce_from_tp(partial, tp_);
}

torch::Tensor VocabParallelEmbeddingImpl::logits(const torch::Tensor& x, bool lookup_follows) {
  // As a column-parallel layer's: the input gathered over the tokens (sequence parallelism) or
  // its gradient all-reduced, the weight gradient written into the main grads.
  return linear(x, weight, {}, LinearComm::column(tp_, lookup_follows ? main_grads_first_part.get() : main_grads));
}

std::vector<std::pair<std::string, ShardInfo>> VocabParallelEmbeddingImpl::shards() const {
  return {{"weight", {{vocab_, hidden_}, 0, false}}};
}

NormImpl::NormImpl(const std::string& kind, int64_t hidden, double eps)
    : torch::nn::Module(kind == "rmsnorm" ? "RMSNorm" : "LayerNorm"), rms_(kind == "rmsnorm"), hidden_(hidden), eps_(eps) {
  ME_CHECK(kind == "rmsnorm" || kind == "layernorm", "norm kind '", kind, "': expected layernorm or rmsnorm");
  weight = register_parameter("weight", torch::ones({hidden}));
  if (!rms_) bias = register_parameter("bias", torch::zeros({hidden}));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  return rms_ ? compat::rms_norm(x, weight, eps_) : torch::layer_norm(x, {hidden_}, weight, bias, eps_);
}

NormImpl::Sum NormImpl::add_forward(const torch::Tensor& x, const torch::Tensor& delta) {
  if (!delta.defined()) return {x, forward(x)};
  if (kernels::use(kernels::Op::add_norm, x) && kernels::add_norm_fits(x, delta, weight, bias)) {
    auto r = kernels::add_norm(x, delta, weight, bias, eps_, rms_);
    return {r.sum, r.y};
  }
  auto sum = x + delta;
  return {sum, forward(sum)};
}

void NormImpl::pretty_print(std::ostream& os) const {
  os << name() << "(" << hidden_ << ", eps=" << eps_ << ")";
}

namespace {

// Loss per position from vocabulary-split logits, with its own backward so the full
// softmax is never materialised: grad = (softmax - onehot(label)) * grad_out, per shard.
struct VocabParallelCE : public torch::autograd::Function<VocabParallelCE> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& labels,
                               comm::ProcessGroup* g, int64_t ignore_index, int64_t real) {
    const int64_t local = logits.size(-1);
    const int64_t start = g ? local * g->rank() : 0;
    // One fp32 copy of the logits, turned into the softmax in place: the [tokens, vocab]
    // tensors are the largest of the step, and each extra one costs a pass and its memory.
    auto x = logits.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);  // never the input itself
    // Vocabulary padding is -inf: probability 0, gradient 0 (exp below), the same at every tp.
    if (real < local) x.narrow(-1, real, local - real).fill_(-std::numeric_limits<float>::infinity());
    auto max = std::get<0>(x.max(-1));
    if (g) g->all_reduce(max, comm::ReduceOp::max);
    x.sub_(max.unsqueeze(-1));
    auto in_range = (labels >= start) & (labels < start + local);
    auto local_label = (labels - start).masked_fill(~in_range, 0);
    auto target = x.gather(-1, local_label.unsqueeze(-1)).squeeze(-1).masked_fill(~in_range, 0.0);
    x.exp_();
    auto sum_exp = x.sum(-1);
    if (g) {
      g->all_reduce(target, comm::ReduceOp::sum);
      g->all_reduce(sum_exp, comm::ReduceOp::sum);
    }
    auto loss = sum_exp.log() - target;
    auto counted = labels != ignore_index;
    loss = loss.masked_fill(~counted, 0.0);
    x.div_(sum_exp.unsqueeze(-1));  // the softmax
    ctx->save_for_backward({x, local_label, in_range & counted, counted});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& local_label = saved[1];
    const auto& hit = saved[2];
    const auto& counted = saved[3];
    // (softmax - one_hot(label)) x the incoming gradient, masked where the label is ignored.
    auto scale = (grads[0] * counted.to(grads[0].dtype())).unsqueeze(-1);
    auto grad = saved[0] * scale;
    grad.scatter_add_(-1, local_label.unsqueeze(-1), -hit.to(grad.dtype()).unsqueeze(-1) * scale);
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The same loss through engine/kernels: forward reads the (bf16) logits once, backward turns
// them into the gradient in place; no fp32 copy of the [tokens, vocab] logits exists. Shards
// combine per row: the global max, each shard's sum of exponentials rescaled to it.
struct FusedVocabParallelCE : public torch::autograd::Function<FusedVocabParallelCE> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& labels,
                               comm::ProcessGroup* g, int64_t ignore_index, int64_t real) {
    const int64_t local = logits.size(-1);
    const int64_t start = g ? local * g->rank() : 0;
    auto x = logits.reshape({-1, local});
    if (!x.is_contiguous()) x = x.contiguous();
    auto flat_labels = labels.reshape({-1});
    auto st = kernels::cross_entropy_stats(x, flat_labels, start, real);
    auto max = st.max;
    if (g) {
      auto global = max.clone();
      g->all_reduce(global, comm::ReduceOp::max);
      st.sum_exp.mul_((max - global).exp_());
      g->all_reduce(st.sum_exp, comm::ReduceOp::sum);
      g->all_reduce(st.target, comm::ReduceOp::sum);
      max = global;
    }
    auto lse = st.sum_exp.log_().add_(max);
    auto counted = flat_labels != ignore_index;
    auto loss = (lse - st.target).masked_fill_(~counted, 0.0);
    ctx->save_for_backward({x, flat_labels, lse, counted});
    ctx->saved_data["start"] = start;
    ctx->saved_data["real"] = real;
    ctx->saved_data["shape"] = logits.sizes().vec();
    return loss.view(labels.sizes());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto x = saved[0];
    auto grad_row = grads[0].reshape({-1}).to(torch::kFloat) * saved[3];
    kernels::cross_entropy_backward_(x, saved[1], ctx->saved_data["start"].toInt(), ctx->saved_data["real"].toInt(),
                                     saved[2], grad_row);
    return {x.view(ctx->saved_data["shape"].toIntVector()), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels,
                                           const TensorParallel& tp, int64_t ignore_index, int64_t vocab) {
  comm::ProcessGroup* group = tp.active() ? tp.group : nullptr;
  const int64_t local = logits.size(-1), start = group ? local * group->rank() : 0;
  // This shard's real columns: all of them, some, or none (a last shard of only padding).
  const int64_t real = vocab < 0 ? local : std::clamp<int64_t>(vocab - start, 0, local);
  auto per_token = kernels::use(kernels::Op::cross_entropy, logits)
                       ? FusedVocabParallelCE::apply(logits, labels, group, ignore_index, real)
                       : VocabParallelCE::apply(logits, labels, group, ignore_index, real);
  auto count = (labels != ignore_index).sum().clamp_min(1);
  return per_token.sum() / count;
}

Rotary::Rotary(int64_t head_dim, int64_t max_seq, double base) {
  ME_CHECK(head_dim % 2 == 0, "rotary embeddings need an even head dimension, got ", head_dim);
  auto inv = torch::pow(base, -torch::arange(0, head_dim, 2, torch::kDouble) / static_cast<double>(head_dim));
  auto angles = torch::outer(torch::arange(max_seq, torch::kDouble), inv);  // [seq, d/2]
  auto full = torch::cat({angles, angles}, -1);                             // [seq, d]
  cos_ = full.cos().to(torch::kFloat);
  sin_ = full.sin().to(torch::kFloat);
}

const torch::Tensor& Rotary::cos_half(const torch::Device& device) const {
  if (!cos_half_.defined() || cos_half_.device() != device) {
    const int64_t half = cos_.size(1) / 2;
    cos_half_ = cos_.narrow(1, 0, half).contiguous().to(device);
    sin_half_ = sin_.narrow(1, 0, half).contiguous().to(device);
  }
  return cos_half_;
}

const torch::Tensor& Rotary::sin_half(const torch::Device& device) const {
  cos_half(device);
  return sin_half_;
}

torch::Tensor Rotary::apply(const torch::Tensor& x) const {
  const int64_t s = x.size(2), half = x.size(-1) / 2;
  if (!cos_cached_.defined() || cos_cached_.device() != x.device() || cos_cached_.scalar_type() != x.scalar_type()) {
    cos_cached_ = cos_.to(x.device(), x.scalar_type());
    sin_cached_ = sin_.to(x.device(), x.scalar_type());
  }
  auto cos = cos_cached_.narrow(0, 0, s);
  auto sin = sin_cached_.narrow(0, 0, s);
  auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace me::parallel
