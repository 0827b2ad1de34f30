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

void WeightGradQueue::begin_micro_batch() {
  std::lock_guard<std::mutex> lock(mutex_);
  batches_.emplace_back();
}

void WeightGradQueue::push(std::function<void()> gemms) {
  std::lock_guard<std::mutex> lock(mutex_);
  ME_CHECK(!batches_.empty(), "weight-gradient queue: a GEMM queued outside a micro-batch's backward");
  batches_.back().push_back(std::move(gemms));
}

size_t WeightGradQueue::micro_batches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return batches_.size();
}

void WeightGradQueue::run_oldest() {
  std::vector<std::function<void()>> oldest;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (batches_.empty()) return;
    oldest = std::move(batches_.front());
    batches_.pop_front();
  }
  for (auto& gemms : oldest) gemms();
}

void WeightGradQueue::run_down_to(size_t keep) {
  while (micro_batches() > keep) run_oldest();
}

void WeightGradQueue::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  batches_.clear();
}

torch::Tensor linear_bias(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  if (!b.defined() || !x.is_contiguous() || !kernels::use(kernels::Op::linear_bias, x))
    return torch::nn::functional::linear(x, w, b);
  auto sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  return torch::addmm(b, x.reshape({-1, x.size(-1)}), w.t()).view(sizes);
}

namespace {

// The weight and bias gradients of y = x w^T + b from dy [rows, out] and x [rows, in]: into the
// sink's main grads, one GEMM per micro-batch writing in their dtype (fp32, or bf16) and adding
// into what earlier micro-batches left there, each marked written; or, with no sink (or a
// weight it does not hold), returned.
std::pair<torch::Tensor, torch::Tensor> compute_weight_grads(const torch::Tensor& dy, const torch::Tensor& x,
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
      // The column sums as ones^T dy, written (or added) by cuBLAS in the main grad's dtype: one
      // read of dy, measured 15% faster than LibTorch's dim-0 sum on the H100, and no separate add.
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

// compute_weight_grads, or, while the sink holds weight gradients back (a pipeline schedule's
// parallel.pp_deferred_wgrads) and both go into its main grads, the same GEMMs queued for later.
std::pair<torch::Tensor, torch::Tensor> weight_grads(const torch::Tensor& dy, const torch::Tensor& x,
                                                     const torch::Tensor& w, const torch::Tensor& b,
                                                     MainGradSink* sink) {
  bool accumulate = false;
  if (auto* queue = sink ? sink->held_back() : nullptr;
      queue && sink->main_grad(w, &accumulate).defined() && (!b.defined() || sink->main_grad(b, &accumulate).defined())) {
    queue->push([dy, x, w, b, sink] {
      torch::NoGradGuard no_grad;  // as inside backward: plain GEMMs into the buffer
      compute_weight_grads(dy, x, w, b, sink);
    });
    return {};
  }
  return compute_weight_grads(dy, x, w, b, sink);
}

// {x w^T + b, gelu of it} from one GEMM (cuBLASLt's epilogue), or composed where cuBLASLt offers
// no kernel for the shape.
kernels::Activated gelu_epilogue(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  if (auto a = kernels::linear_gelu(x, w, b); a.pre.defined()) return a;
  auto pre = linear_bias(x, w, b);
  return {pre, torch::gelu(pre, "tanh")};
}

// A [..., n] tensor as rows [-1, n]: `rows_of` for inputs (a copy if they need one), `rows_in`
// for outputs about to be written (a view, or an error, since writes must reach the tensor).
torch::Tensor rows_of(const torch::Tensor& t) { return t.reshape({-1, t.size(-1)}); }
torch::Tensor rows_in(const torch::Tensor& t) { return t.view({-1, t.size(-1)}); }

// The same two into existing outputs: rows x2 [n, in] into pre and act (act undefined: no GeLU).
void linear_into(const torch::Tensor& x2, const torch::Tensor& w, const torch::Tensor& b, torch::Tensor pre,
                 torch::Tensor act) {
  if (act.defined() && kernels::gemm_gelu_fits(x2, w) && kernels::linear_gelu(x2, w, b, {pre, act}).pre.defined())
    return;
  if (b.defined() && (!x2.is_cuda() || kernels::use(kernels::Op::linear_bias, x2))) {
    at::addmm_out(pre, b, x2, w.t());  // the bias in the GEMM's epilogue, as linear_bias
  } else {
    at::mm_out(pre, x2, w.t());
    if (b.defined()) pre.add_(b);
  }
  if (act.defined()) act.copy_(torch::gelu(pre, "tanh"));
}

// Rows x2 of pre's gradient, (dy w) * gelu'(pre), into `into` (one GEMM with the dGeLU epilogue
// where cuBLASLt has one).
void dgelu_into(const torch::Tensor& dy2, const torch::Tensor& w, const torch::Tensor& pre2, torch::Tensor into) {
  if (kernels::gemm_gelu_fits(dy2, w.t()) && kernels::matmul_dgelu(dy2, w, pre2, into).defined()) return;
  into.copy_(at::gelu_backward(dy2.mm(w), pre2, "tanh"));
}

// A row-parallel layer's output under sequence parallelism: this rank's tokens of the TP sum of
// the partial products f(rows of x) ([n, cols] each). With the overlap, each other rank's rows
// are computed and sent to it while the next rows are computed; else one GEMM, then one
// reduce-scatter.
torch::Tensor reduce_scattered(const torch::Tensor& x, int64_t cols, const TensorParallel& tp,
                               const std::function<torch::Tensor(const torch::Tensor&)>& f) {
  auto sizes = x.sizes().vec();
  sizes.back() = cols;
  if (!tp.overlap_comm) return reduce_scatter_tokens(f(rows_of(x)).view(sizes), *tp.group);
  check_tokens_split(x, tp.size(), "sequence-parallel reduce-scatter");
  sizes[1] /= tp.size();
  const auto x2 = rows_of(x);
  const int64_t chunk = x2.size(0) / tp.size();
  return reduce_scatter_rows(chunk, tp, [&](int64_t first, int64_t n) { return f(x2.narrow(0, first, n)); })
      .view(sizes);
}

// The gradient of reduce_scattered's input from this rank's tokens' output gradient dy: dy
// all-gathered over the tokens (returned, for the weight gradient) while the input gradient of
// this rank's own rows is computed by rows_into, then the rest.
torch::Tensor gathered_grad(const torch::Tensor& dy, const TensorParallel& tp, const RowsInto& rows_into) {
  if (tp.overlap_comm) return all_gather_rows(dy, tp, rows_into);
  auto full = all_gather_tokens(dy, *tp.group);
  rows_into(rows_of(full), 0);
  return full;
}

// The linear functions below take their tensors as one TensorList and exactly one other
// argument (a LinearCall or a LinearComm). A backward returns the gradients in the order of
// the inputs, then nothing for that argument; autograd drops trailing undefined ones (a missing
// bias's, the argument's), so no list needs counting.
variable_list input_grads(std::initializer_list<torch::Tensor> tensor_grads) {
  variable_list out(tensor_grads);
  out.emplace_back();  // the one non-tensor argument
  return out;
}

// A LinearMainGrad call: how the layer communicates, and whether GeLU joins the GEMM.
struct LinearCall {
  LinearComm comm;
  bool gelu = false;
};

// LinearMainGrad's forward arithmetic, the same with autograd and without (recomputation runs
// the forward both ways and must get the same numbers): {the input as the GEMM saw it, output}.
struct LinearForward {
  torch::Tensor x;
  kernels::Activated y;
};
LinearForward linear_forward(const torch::Tensor& in, const torch::Tensor& w, const torch::Tensor& b,
                             const LinearComm& comm, bool gelu) {
  LinearForward f;
  const auto* tp = comm.column_tp();
  if (tp && tp->sequence_parallel && tp->overlap_comm) {
    auto sizes = gathered_tokens_shape(in, tp->size());
    sizes.back() = w.size(0);
    f.y.pre = torch::empty(sizes, in.options());
    if (gelu) f.y.out = torch::empty(sizes, in.options());
    const auto pre2 = rows_in(f.y.pre), act2 = gelu ? rows_in(f.y.out) : torch::Tensor();
    f.x = all_gather_rows(in, *tp, [&](const torch::Tensor& rows, int64_t first) {
      const auto n = rows.size(0);
      linear_into(rows, w, b, pre2.narrow(0, first, n), gelu ? act2.narrow(0, first, n) : torch::Tensor());
    });
    return f;
  }
  f.x = tp && tp->sequence_parallel ? all_gather_tokens(in, *tp->group) : in;
  if (const auto* out_tp = comm.row_tp())
    f.y.pre = reduce_scattered(f.x, w.size(0), *out_tp, [&](const torch::Tensor& r) { return linear_bias(r, w, b); });
  else if (gelu) f.y = gelu_epilogue(f.x, w, b);
  else f.y.pre = linear_bias(f.x, w, b);
  return f;
}

// The input gradient of a column layer's input, reduced over TP (all-reduce, or reduce-scatter
// of the tokens under sequence parallelism), on a side stream when the layer overlaps its
// collectives; `join` waits for it.
void reduce_input_grad(torch::Tensor& dx, const TensorParallel& tp, std::function<void()>& join) {
  if (tp.sequence_parallel && tp.overlap_comm)
    if (auto finish = start_peer_reduce_scatter(dx, tp)) {  // the copy engines (TensorParallel::peers)
      join = [&dx, finish] { dx = finish(); };
      return;
    }
  auto full = dx;
  auto reduce = [&dx, full, &tp] {
    if (tp.sequence_parallel) dx = reduce_scatter_tokens(full, *tp.group);
    else tp.group->all_reduce(dx, comm::ReduceOp::sum);
  };
  if (tp.overlap_comm) join = start_collective({full}, reduce, &dx);
  else reduce();
}

// y = x w^T + b communicating as its LinearComm says (layers.h), the weight gradients through
// weight_grads (gradient-accumulation fusion). With gelu: outputs {pre, gelu(pre)} from one
// GEMM (GeLU in cuBLASLt's epilogue); the second carries no gradient (gelu_linear, its consumer,
// differentiates through pre). Inputs {x, w} or {x, w, b} (an autograd function's inputs must be
// defined tensors).
struct LinearMainGrad : public torch::autograd::Function<LinearMainGrad> {
  static variable_list forward(AutogradContext* ctx, at::TensorList in, const LinearCall& call) {
    const auto& comm = call.comm;
    const bool gelu = call.gelu;
    save_state(ctx, "comm", comm);
    // gelu(pre) never has a gradient: without this LibTorch would zero-fill one for it, a full
    // [tokens, 4h] pass per layer.
    ctx->set_materialize_grads(false);
    const auto b = in.size() > 2 ? in[2] : torch::Tensor();
    auto f = linear_forward(in[0], in[1], b, comm, gelu);
    auto saved = in.vec();
    saved[0] = f.x;
    ctx->save_for_backward(saved);
    if (!gelu) return {f.y.pre};
    ctx->mark_non_differentiable({f.y.out});
    return {f.y.pre, f.y.out};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1];
    const auto b = saved.size() > 2 ? saved[2] : torch::Tensor();
    const auto& comm = saved_state<LinearComm>(ctx, "comm");
    if (!grads[0].defined()) return {};  // nothing flowed back
    torch::Tensor dy, dx;
    if (const auto* out_tp = comm.row_tp()) {
      dx = torch::empty(x.sizes(), x.options());
      const auto dx2 = rows_in(dx);
      dy = rows_of(gathered_grad(grads[0].contiguous(), *out_tp, [&](const torch::Tensor& rows, int64_t first) {
        auto into = dx2.narrow(0, first, rows.size(0));
        at::mm_out(into, rows, w);
      }));
    } else {
      dy = rows_of(grads[0]);
      dx = dy.mm(w).view(x.sizes());
    }
    std::function<void()> join = [] {};
    const auto* tp = comm.column_tp();
    if (tp) reduce_input_grad(dx, *tp, join);
    torch::Tensor dw, db;
    if (ctx->needs_input_grad(1) || (b.defined() && ctx->needs_input_grad(2))) {  // not for a frozen layer
      std::optional<SmMarginForCollective> margin;
      if (tp && tp->overlap_comm) margin.emplace(dy, *tp);  // the reduction runs beside
      std::tie(dw, db) = weight_grads(dy, rows_of(x), w, b, comm.sink);
    }
    join();
    return input_grads({dx, dw, db});
  }
};

// GeluLinearMainGrad's forward, with autograd or without.
torch::Tensor gelu_linear_forward(const torch::Tensor& act, const torch::Tensor& w, const torch::Tensor& b,
                                  const LinearComm& comm) {
  if (const auto* out_tp = comm.row_tp())
    return reduce_scattered(act, w.size(0), *out_tp, [&](const torch::Tensor& r) { return linear_bias(r, w, b); });
  return linear_bias(act, w, b);
}

// y = act w^T + b where act = gelu(pre) came from LinearMainGrad's epilogue: backward forms
// pre's gradient (dy w) * gelu'(pre) in the input-gradient GEMM's epilogue. As a row layer,
// as LinearMainGrad's: the output reduce-scattered over the tokens, overlapped both ways.
// Inputs {pre, act, w} or {pre, act, w, b}.
struct GeluLinearMainGrad : public torch::autograd::Function<GeluLinearMainGrad> {
  static torch::Tensor forward(AutogradContext* ctx, at::TensorList in, const LinearComm& comm) {
    save_state(ctx, "comm", comm);
    ctx->save_for_backward(in.vec());
    return gelu_linear_forward(in[1], in[2], in.size() > 3 ? in[3] : torch::Tensor(), comm);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &pre = saved[0], &act = saved[1], &w = saved[2];
    const auto b = saved.size() > 3 ? saved[3] : torch::Tensor();
    const auto& comm = saved_state<LinearComm>(ctx, "comm");
    auto dpre = torch::empty(pre.sizes(), pre.options());
    const auto dpre2 = rows_in(dpre), pre2 = rows_of(pre);
    auto rows_into = [&](const torch::Tensor& rows, int64_t first) {
      const auto n = rows.size(0);
      dgelu_into(rows, w, pre2.narrow(0, first, n), dpre2.narrow(0, first, n));
    };
    torch::Tensor dy;
    if (const auto* out_tp = comm.row_tp()) {
      dy = rows_of(gathered_grad(grads[0].contiguous(), *out_tp, rows_into));
    } else {
      dy = rows_of(grads[0]);
      rows_into(dy, 0);
    }
    torch::Tensor dw, db;
    if (ctx->needs_input_grad(2) || (b.defined() && ctx->needs_input_grad(3)))  // not for a frozen layer
      std::tie(dw, db) = weight_grads(dy, rows_of(act), w, b, comm.sink);
    return input_grads({dpre, torch::Tensor(), dw, db});
  }
};

// A row layer's output is reduce-scattered inside the GEMM's function only under sequence
// parallelism (without it the layer all-reduces after the GEMM), and its bias is added after.
void check_row(const LinearComm& comm, const torch::Tensor& b) {
  if (!comm.row_tp()) return;
  ME_CHECK(comm.tp->sequence_parallel, "linear: a row role is for sequence parallelism (without it the layer all-reduces)");
  ME_CHECK(!b.defined(), "linear: a row layer's bias is added after the reduction, by the caller");
}
}  // namespace

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, const LinearComm& comm) {
  check_row(comm, b);
  const bool communicates = comm.column_tp() || comm.row_tp();
  if (!communicates && (!comm.sink || !torch::GradMode::is_enabled() || !w.requires_grad())) return linear_bias(x, w, b);
  if (!torch::GradMode::is_enabled()) return linear_forward(x, w, b, comm, false).y.pre;
  const auto in = b.defined() ? variable_list{x, w, b} : variable_list{x, w};
  // As a TensorList: a std::vector would be taken for a non-tensor argument (no gradient).
  return LinearMainGrad::apply(at::TensorList(in), LinearCall{comm, false})[0];
}

kernels::Activated linear_gelu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                               const LinearComm& comm) {
  ME_CHECK(comm.role != LinearComm::Role::row, "linear_gelu: the GeLU epilogue is a column (or local) layer's");
  if (!torch::GradMode::is_enabled()) return linear_forward(x, w, b, comm, true).y;
  const auto in = b.defined() ? variable_list{x, w, b} : variable_list{x, w};
  auto out = LinearMainGrad::apply(at::TensorList(in), LinearCall{comm, true});
  return {out[0], out[1]};
}

torch::Tensor gelu_linear(const kernels::Activated& a, const torch::Tensor& w, const torch::Tensor& b,
                          const LinearComm& comm) {
  ME_CHECK(comm.role != LinearComm::Role::column, "gelu_linear: the dGeLU epilogue is a row (or local) layer's");
  check_row(comm, b);
  if (!torch::GradMode::is_enabled() || (!w.requires_grad() && !a.pre.requires_grad()))
    return gelu_linear_forward(a.out, w, b, comm);
  const auto in = b.defined() ? variable_list{a.pre, a.out, w, b} : variable_list{a.pre, a.out, w};
  return GeluLinearMainGrad::apply(at::TensorList(in), comm);
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
  return linear_gelu(x, weight, bias, LinearComm::column(tp_, main_grads));
}

torch::Tensor ColumnParallelLinearImpl::forward_with(const torch::Tensor& x, const torch::Tensor& w) {
  // A weight owned elsewhere also gets gradients elsewhere: autograd sums them, not the sink.
  auto y = linear(x, w, bias, LinearComm::column(tp_, w.is_same(weight) ? main_grads : nullptr));
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

// Under sequence parallelism the reduce-scatter happens inside the GEMM's function (overlapped
// with it); without, the partial products are all-reduced after it. The bias is added once, after.
torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  // Nothing to reduce: the bias can join the GEMM.
  if (!tp_.active()) return linear(x, weight, bias, LinearComm::local(main_grads));
  if (tp_.sequence_parallel) return add_bias(linear(x, weight, {}, LinearComm::row(tp_, main_grads)));
  return add_bias(reduce_from_tp(linear(x, weight, {}, LinearComm::local(main_grads)), tp_));
}

torch::Tensor RowParallelLinearImpl::forward_gelu(const kernels::Activated& a) {
  if (!a.out.defined()) return forward(torch::gelu(a.pre, "tanh"));
  if (!tp_.active()) return gelu_linear(a, weight, bias, LinearComm::local(main_grads));
  if (tp_.sequence_parallel) return add_bias(gelu_linear(a, weight, {}, LinearComm::row(tp_, main_grads)));
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
