#include "engine/parallel/layers.h"

#include "engine/core/error.h"
#include "engine/core/torch_compat.h"
#include "engine/kernels/fused_ops.h"
#include "engine/parallel/mappings.h"

#if ME_TORCH_HAS_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <mutex>
#endif

namespace me::parallel {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {
int64_t divide(int64_t n, int64_t parts, const char* what) {
  ME_CHECK(n % parts == 0, what, " (", n, ") is not divisible by the tensor-parallel size ", parts);
  return n / parts;
}
}  // namespace

torch::Tensor linear_bias(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  if (!b.defined() || !x.is_contiguous() || !kernels::use(kernels::Op::linear_bias, x))
    return torch::nn::functional::linear(x, w, b);
  auto sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  return torch::addmm(b, x.reshape({-1, x.size(-1)}), w.t()).view(sizes);
}

namespace {

#if ME_TORCH_HAS_CUDA
// One side stream per GPU for tensor-parallel collectives in backward.
c10::cuda::CUDAStream tp_stream(c10::DeviceIndex device) {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams.find(device);
  if (it == streams.end()) it = streams.emplace(device, c10::cuda::getStreamFromPool(true, device)).first;
  return it->second;
}
#endif

// Runs `collective` (which produces `*out`) on the GPU's TP side stream, after the work queued so
// far on the current stream, so the caller's next kernels overlap with it; the returned function
// orders the current stream after it. On the CPU it runs at once.
std::function<void()> start_collective(const torch::Tensor& in, torch::Tensor* out,
                                       const std::function<void()>& collective) {
#if ME_TORCH_HAS_CUDA
  if (in.is_cuda()) {
    const auto compute = c10::cuda::getCurrentCUDAStream(in.device().index());
    const auto side = tp_stream(in.device().index());
    at::cuda::CUDAEvent ready;
    ready.record(compute);
    ready.block(side);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      collective();
    }
    in.record_stream(side);  // the allocator must not reuse either block before both streams are done
    out->record_stream(compute);
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(side);
    return [done, compute] { done->block(compute); };
  }
#endif
  collective();
  return [] {};
}

// The weight and bias gradients of y = x w^T + b from dy [rows, out] and x [rows, in]: into the
// sink's main grads, one fp32-output GEMM per micro-batch adding into what earlier micro-batches
// left there, each marked written; or, with no sink (or a weight it does not hold), returned.
std::pair<torch::Tensor, torch::Tensor> weight_grads(const torch::Tensor& dy, const torch::Tensor& x,
                                                     const torch::Tensor& w, const torch::Tensor& b,
                                                     MainGradSink* sink) {
  torch::Tensor dw, db;
  bool accumulate = false;
  if (auto main = sink ? sink->main_grad(w, &accumulate) : torch::Tensor(); main.defined()) {
    compat::matmul_into(main, dy.t(), x, accumulate);
    sink->mark_written(w);
  } else {
    dw = dy.t().mm(x);
  }
  if (!b.defined()) return {dw, db};
  if (auto main = sink ? sink->main_grad(b, &accumulate) : torch::Tensor(); main.defined()) {
    if (dy.is_cuda()) {
      // The column sums as ones^T dy, written (or added) in fp32 by cuBLAS: one read of dy,
      // measured 15% faster than LibTorch's dim-0 sum on the H100, and no separate add.
      auto row = main.view({1, -1});
      compat::matmul_into(row, torch::ones({1, dy.size(0)}, dy.options()), dy, accumulate);
    } else {
      auto sum = dy.sum(0, /*keepdim=*/false, main.scalar_type());
      accumulate ? main.add_(sum) : main.copy_(sum);
    }
    sink->mark_written(b);
  } else {
    db = dy.sum(0);
  }
  return {dw, db};
}

// {x w^T + b, gelu of it} from one GEMM (cuBLASLt's epilogue), or composed where cuBLASLt offers
// no kernel for the shape.
kernels::Activated gelu_epilogue(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  if (auto a = kernels::linear_gelu(x, w, b); a.pre.defined()) return a;
  auto pre = linear_bias(x, w, b);
  return {pre, torch::gelu(pre, "tanh")};
}

// y = x w^T + b whose weight gradients go through weight_grads (gradient-accumulation fusion).
// With a tensor-parallel group (a column-parallel layer's input): forward all-gathers the
// sequence first under sequence parallelism; backward reduces the input gradient over TP
// (all-reduce, or reduce-scatter along the sequence) on a side stream while the weight-gradient
// GEMM runs: Megatron's LinearWithGradAccumulationAndAsyncCommunication.
// With gelu: outputs {pre, gelu(pre)} from one GEMM (GeLU in cuBLASLt's epilogue); the second
// carries no gradient (gelu_linear, its consumer, differentiates through pre).
// Inputs {x, w} or {x, w, b} (an autograd function's inputs must be defined tensors).
struct LinearMainGrad : public torch::autograd::Function<LinearMainGrad> {
  static variable_list forward(AutogradContext* ctx, at::TensorList in, int64_t sink, int64_t input_tp, bool gelu) {
    ctx->saved_data["sink"] = sink;
    ctx->saved_data["tp"] = input_tp;
    // gelu(pre) never has a gradient: without this LibTorch would zero-fill one for it, a full
    // [tokens, 4h] pass per layer.
    ctx->set_materialize_grads(false);
    const auto* tp = reinterpret_cast<const TensorParallel*>(input_tp);
    auto x = tp && tp->sequence_parallel ? all_gather_tokens(in[0], *tp->group) : in[0];
    auto saved = in.vec();
    saved[0] = x;
    ctx->save_for_backward(saved);
    const auto b = in.size() > 2 ? in[2] : torch::Tensor();
    if (!gelu) return {linear_bias(x, in[1], b)};
    auto a = gelu_epilogue(x, in[1], b);
    ctx->mark_non_differentiable({a.out});
    return {a.pre, a.out};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1];
    const auto b = saved.size() > 2 ? saved[2] : torch::Tensor();
    auto* sink = reinterpret_cast<MainGradSink*>(ctx->saved_data["sink"].toInt());
    const auto* tp = reinterpret_cast<const TensorParallel*>(ctx->saved_data["tp"].toInt());
    const size_t inputs = saved.size() + 3;  // the tensors, sink, tp, gelu
    if (!grads[0].defined()) return variable_list(inputs);  // nothing flowed back
    auto dy = grads[0].reshape({-1, w.size(0)});
    auto dx = dy.mm(w).view(x.sizes());
    std::function<void()> join = [] {};
    if (tp) {
      auto full = dx;
      auto reduce = [&] {
        if (tp->sequence_parallel) dx = reduce_scatter_tokens(full, *tp->group);
        else tp->group->all_reduce(dx, comm::ReduceOp::sum);
      };
      if (tp->overlap_comm) join = start_collective(full, &dx, reduce);
      else reduce();
    }
    auto [dw, db] = weight_grads(dy, x.reshape({-1, w.size(1)}), w, b, sink);
    join();
    if (b.defined()) return {dx, dw, db, torch::Tensor(), torch::Tensor(), torch::Tensor()};
    return {dx, dw, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// y = act w^T + b where act = gelu(pre) came from LinearMainGrad's epilogue: backward forms
// pre's gradient (dy w) * gelu'(pre) in the input-gradient GEMM's epilogue.
// Inputs {pre, act, w} or {pre, act, w, b}.
struct GeluLinearMainGrad : public torch::autograd::Function<GeluLinearMainGrad> {
  static torch::Tensor forward(AutogradContext* ctx, at::TensorList in, int64_t sink) {
    ctx->saved_data["sink"] = sink;
    ctx->save_for_backward(in.vec());
    return linear_bias(in[1], in[2], in.size() > 3 ? in[3] : torch::Tensor());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &pre = saved[0], &act = saved[1], &w = saved[2];
    const auto b = saved.size() > 3 ? saved[3] : torch::Tensor();
    auto* sink = reinterpret_cast<MainGradSink*>(ctx->saved_data["sink"].toInt());
    auto dy = grads[0].reshape({-1, w.size(0)});
    auto dpre = kernels::matmul_dgelu(dy, w, pre);
    if (!dpre.defined()) dpre = at::gelu_backward(dy.mm(w).view(pre.sizes()), pre, "tanh");
    auto [dw, db] = weight_grads(dy, act.reshape({-1, w.size(1)}), w, b, sink);
    if (b.defined()) return {dpre.view(pre.sizes()), torch::Tensor(), dw, db, torch::Tensor()};
    return {dpre.view(pre.sizes()), torch::Tensor(), dw, torch::Tensor()};
  }
};

// The input as a column-parallel layer sees it when no gradient is recorded.
torch::Tensor tp_input(const torch::Tensor& x, const TensorParallel* tp) {
  if (!tp) return x;
  return tp->sequence_parallel ? gather_seq(x, *tp) : copy_to_tp(x, *tp);
}

}  // namespace

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, MainGradSink* sink,
                     const TensorParallel* input_tp) {
  if (input_tp && !input_tp->active()) input_tp = nullptr;
  if ((!sink && !input_tp) || !torch::GradMode::is_enabled() || !w.requires_grad())
    return linear_bias(tp_input(x, input_tp), w, b);
  const auto in = b.defined() ? variable_list{x, w, b} : variable_list{x, w};
  // As a TensorList: a std::vector would be taken for a non-tensor argument (no gradient).
  return LinearMainGrad::apply(at::TensorList(in), reinterpret_cast<int64_t>(sink),
                               reinterpret_cast<int64_t>(input_tp), false)[0];
}

kernels::Activated linear_gelu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                               MainGradSink* sink, const TensorParallel* input_tp) {
  if (input_tp && !input_tp->active()) input_tp = nullptr;
  if (!torch::GradMode::is_enabled() || !w.requires_grad()) return gelu_epilogue(tp_input(x, input_tp), w, b);
  const auto in = b.defined() ? variable_list{x, w, b} : variable_list{x, w};
  auto out = LinearMainGrad::apply(at::TensorList(in), reinterpret_cast<int64_t>(sink),
                                   reinterpret_cast<int64_t>(input_tp), true);
  return {out[0], out[1]};
}

torch::Tensor gelu_linear(const kernels::Activated& a, const torch::Tensor& w, const torch::Tensor& b,
                          MainGradSink* sink) {
  if (!torch::GradMode::is_enabled() || (!w.requires_grad() && !a.pre.requires_grad()))
    return linear_bias(a.out, w, b);
  const auto in = b.defined() ? variable_list{a.pre, a.out, w, b} : variable_list{a.pre, a.out, w};
  return GeluLinearMainGrad::apply(at::TensorList(in), reinterpret_cast<int64_t>(sink));
}

void attach_main_grads(torch::nn::Module& model, MainGradSink* sink) {
  for (auto& m : model.modules()) {
    if (auto* column = dynamic_cast<ColumnParallelLinearImpl*>(m.get())) column->main_grads = sink;
    if (auto* row = dynamic_cast<RowParallelLinearImpl*>(m.get())) row->main_grads = sink;
  }
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
  if (!kernels::use(kernels::Op::gemm_gelu, x) || !kernels::gemm_gelu_fits(x, weight)) return {forward(x), {}};
  return linear_gelu(x, weight, bias, main_grads, &tp_);
}

torch::Tensor ColumnParallelLinearImpl::forward_with(const torch::Tensor& x, const torch::Tensor& w) {
  // A weight owned elsewhere also gets gradients elsewhere: autograd sums them, not the sink.
  auto y = linear(x, w, bias, w.is_same(weight) ? main_grads : nullptr, &tp_);
  return gather_output_ ? gather_last(y, tp_) : y;
}

torch::Tensor parallel_lm_logits(const torch::Tensor& x, const torch::Tensor& weight, const TensorParallel& tp) {
  auto input = tp.sequence_parallel ? gather_seq(x, tp) : copy_to_tp(x, tp);
  return torch::nn::functional::linear(input, weight);
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

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  // Nothing to reduce: the bias can join the GEMM.
  if (!tp_.active()) return linear(x, weight, bias, main_grads);
  return reduce_add_bias(linear(x, weight, {}, main_grads));
}

torch::Tensor RowParallelLinearImpl::forward_gelu(const kernels::Activated& a) {
  if (!a.out.defined()) return forward(torch::gelu(a.pre, "tanh"));
  if (!tp_.active()) return gelu_linear(a, weight, bias, main_grads);
  return reduce_add_bias(gelu_linear(a, weight, {}, main_grads));
}

torch::Tensor RowParallelLinearImpl::reduce_add_bias(const torch::Tensor& partial) {
  auto y = tp_.sequence_parallel ? reduce_scatter_seq(partial, tp_) : reduce_from_tp(partial, tp_);
  return bias.defined() ? y + bias : y;
}

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

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& tokens) {
  if (!tp_.active()) return torch::embedding(weight, tokens);
  // Ids outside this rank's range look up row 0 and are zeroed: the all-reduce then sums
  // exactly one real row per id.
  auto outside = (tokens < start_) | (tokens >= start_ + local_);
  auto local_ids = (tokens - start_).masked_fill(outside, 0);
  auto partial = torch::embedding(weight, local_ids).masked_fill(outside.unsqueeze(-1), 0.0);
  return tp_.sequence_parallel ? reduce_scatter_seq(partial, tp_) : reduce_from_tp(partial, tp_);
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
                               int64_t group, int64_t ignore_index) {
    auto* g = reinterpret_cast<comm::ProcessGroup*>(group);
    const int64_t local = logits.size(-1);
    const int64_t start = g ? local * g->rank() : 0;
    // One fp32 copy of the logits, turned into the softmax in place: the [tokens, vocab]
    // tensors are the largest of the step, and each extra one costs a pass and its memory.
    auto x = logits.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);  // never the input itself
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
    return {grad.to(dtype), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The same loss through engine/kernels: forward reads the (bf16) logits once, backward turns
// them into the gradient in place; no fp32 copy of the [tokens, vocab] logits exists. Shards
// combine per row: the global max, each shard's sum of exponentials rescaled to it.
struct FusedVocabParallelCE : public torch::autograd::Function<FusedVocabParallelCE> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& labels,
                               int64_t group, int64_t ignore_index) {
    auto* g = reinterpret_cast<comm::ProcessGroup*>(group);
    const int64_t local = logits.size(-1);
    const int64_t start = g ? local * g->rank() : 0;
    auto x = logits.reshape({-1, local});
    if (!x.is_contiguous()) x = x.contiguous();
    auto flat_labels = labels.reshape({-1});
    auto st = kernels::cross_entropy_stats(x, flat_labels, start);
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
    ctx->saved_data["shape"] = logits.sizes().vec();
    return loss.view(labels.sizes());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto x = saved[0];
    auto grad_row = grads[0].reshape({-1}).to(torch::kFloat) * saved[3];
    kernels::cross_entropy_backward_(x, saved[1], ctx->saved_data["start"].toInt(), saved[2], grad_row);
    return {x.view(ctx->saved_data["shape"].toIntVector()), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels,
                                           const TensorParallel& tp, int64_t ignore_index) {
  const auto group = reinterpret_cast<int64_t>(tp.active() ? tp.group : nullptr);
  auto per_token = kernels::use(kernels::Op::cross_entropy, logits)
                       ? FusedVocabParallelCE::apply(logits, labels, group, ignore_index)
                       : VocabParallelCE::apply(logits, labels, group, ignore_index);
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
