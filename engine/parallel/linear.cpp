// The linear layers' arithmetic and communication (layers.h: linear, linear_gelu, gelu_linear,
// linear_bias, the weight-gradient queue): one autograd function per form, each overlapping its
// tensor-parallel collectives with its GEMMs; the modules that call them are in layers.cpp.
#include "engine/parallel/layers.h"

#include "engine/core/autograd_state.h"
#include "engine/core/error.h"
#include "engine/core/graph_capture.h"
#include "engine/core/torch_compat.h"
#include "engine/kernels/fused_ops.h"
#include "engine/parallel/collective_matmul.h"
#include "engine/parallel/mappings.h"

#include <torch/csrc/autograd/engine.h>

#if ME_TORCH_HAS_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <set>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

namespace me::parallel {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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

namespace {
std::mutex delayed_mutex;
std::function<void()> delayed;  // DelayedWeightGrad's held GEMM

// parallel.tp_wgrad_stream (off by default) or ME_TP_WGRAD_STREAM=m (an experiment): the held
// weight-gradient GEMMs run on a stream of their own, leaving none or m multiprocessors free, so
// that what backward's compute stream does meanwhile runs beside them instead of after them. At
// tp 4 that is each reduce-scatter's chain (its barrier, the sum, the norm backward, the local
// copies: about 155 us a collective at the GPT-39B width, bench/RESULTS.md, twenty-seventh
// session). m = 0 was 1-4.5% faster a layer there in three calls, not at the LLaMA-2-70B width in
// one (twenty-eighth session): not yet a default.
std::atomic<bool> wgrad_stream_on{false};  // parallel.tp_wgrad_stream
// Multiprocessors the held GEMMs leave free on their own stream; -1: they run on the compute stream.
int wgrad_stream_margin() {
  static const int from_env = [] {
    const char* v = std::getenv("ME_TP_WGRAD_STREAM");
    return v ? std::max(0, std::atoi(v)) : -1;
  }();
  return from_env >= 0 ? from_env : wgrad_stream_on.load() ? 0 : -1;
}

#if ME_TORCH_HAS_CUDA
std::mutex wgrad_mutex;
std::map<c10::DeviceIndex, c10::cuda::CUDAStream> wgrad_streams;
std::set<c10::DeviceIndex> wgrad_pending;  // devices whose compute stream has not yet waited for it

c10::cuda::CUDAStream wgrad_stream(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(wgrad_mutex);
  auto it = wgrad_streams.find(device);
  if (it == wgrad_streams.end())
    it = wgrad_streams.emplace(device, c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device)).first;
  return it->second;
}

// The current stream of each of `devices` waits for what their weight-gradient streams have run so
// far (nothing to wait for on that stream itself).
void current_waits_for_wgrad_streams(const std::set<c10::DeviceIndex>& devices) {
  for (const auto device : devices) {
    const auto side = wgrad_stream(device);
    const auto current = c10::cuda::getCurrentCUDAStream(device);
    if (current == side) continue;
    at::cuda::CUDAEvent done;
    done.record(side);
    done.block(current);
  }
}
#endif
}  // namespace

void DelayedWeightGrad::set_own_stream(bool on) { wgrad_stream_on = on; }

// The held GEMMs on their own stream (parallel.tp_wgrad_stream, ME_TP_WGRAD_STREAM): after what
// the compute stream has queued, with `uses` (their operands, freed on the compute stream later)
// recorded on it so that the allocator does not hand their memory out before the GEMMs are done.
// What they write (the main grads) is read elsewhere only after a fence, or after backward, when
// DelayedWeightGrad::join has made the compute stream wait.
std::function<void()> DelayedWeightGrad::on_own_stream(std::function<void()> gemms, std::vector<torch::Tensor> uses) {
#if ME_TORCH_HAS_CUDA
  if (const int margin = wgrad_stream_margin(); margin >= 0 && !uses.empty() && uses.front().is_cuda())
    return [gemms = std::move(gemms), uses = std::move(uses), margin] {
      const auto device = uses.front().device().index();
      const auto side = wgrad_stream(device);
      at::cuda::CUDAEvent ready;
      ready.record(c10::cuda::getCurrentCUDAStream(device));
      ready.block(side);
      for (const auto& t : uses)
        if (t.defined()) t.record_stream(side);
      {
        c10::cuda::CUDAStreamGuard guard(side);
        SmMarginForCollective sm_margin(uses.front(), margin);
        gemms();
      }
      std::lock_guard<std::mutex> lock(wgrad_mutex);
      wgrad_pending.insert(device);
    };
#endif
  (void)uses;
  return gemms;
}

void DelayedWeightGrad::join() {
#if ME_TORCH_HAS_CUDA
  std::set<c10::DeviceIndex> devices;
  {
    std::lock_guard<std::mutex> lock(wgrad_mutex);
    devices.swap(wgrad_pending);
  }
  current_waits_for_wgrad_streams(devices);
#endif
}

void DelayedWeightGrad::fence() {
#if ME_TORCH_HAS_CUDA
  std::set<c10::DeviceIndex> devices;
  {
    std::lock_guard<std::mutex> lock(wgrad_mutex);
    devices = wgrad_pending;
  }
  current_waits_for_wgrad_streams(devices);
#endif
}

void DelayedWeightGrad::hold(std::function<void()> gemms) {
  std::function<void()> older;
  {
    std::lock_guard<std::mutex> lock(delayed_mutex);
    older = std::move(delayed);
    delayed = std::move(gemms);
  }
  if (older) older();
  // At the latest when this backward pass ends (a recomputed block's nested pass included); then
  // the compute stream waits for what ran on the weight-gradient stream.
  torch::autograd::Engine::get_default_engine().queue_callback([] {
    DelayedWeightGrad::run();
    DelayedWeightGrad::join();
  });
}

void DelayedWeightGrad::run() {
  std::function<void()> gemms;
  {
    std::lock_guard<std::mutex> lock(delayed_mutex);
    gemms = std::move(delayed);
    delayed = nullptr;
  }
  if (gemms) gemms();
}

void DelayedWeightGrad::drop() {
  std::lock_guard<std::mutex> lock(delayed_mutex);
  delayed = nullptr;
}

torch::Tensor linear_bias(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  if (!b.defined() || !x.is_contiguous() || !kernels::use(kernels::Op::linear_bias, x))
    return torch::nn::functional::linear(x, w, b);
  auto sizes = x.sizes().vec();
  sizes.back() = w.size(0);
  return torch::addmm(b, x.reshape({-1, x.size(-1)}), w.t()).view(sizes);
}

namespace {

// The fp8 operands of a weight gradient dy^T x (precision = "fp8"): dy^T and x^T, row-major.
struct Fp8WeightGrad {
  kernels::Fp8Matrix dy_t, x_t;
};

// A row of n ones in dy's dtype on its device, for the bias gradient's GEMM: kept from one call
// to the next (per thread, grown when a call needs more) rather than made and filled for every
// layer and micro-batch (an allocation and a fill kernel each: host time, which at tp 4 paces the
// step). One per stream, so that every use is on the stream it was filled on and a row replaced
// by a longer one is freed where it was used (backward's stream, or ME_TP_WGRAD_STREAM's).
torch::Tensor ones_row(const torch::Tensor& dy, int64_t n) {
  struct Kept {
    torch::Tensor row;
    int64_t stream;
  };
  thread_local std::vector<Kept> kept;
  // A CUDA graph's own: a kept row filled inside one capture holds ones only once that graph ran.
  if (graph_capture_underway()) return torch::ones({1, n}, dy.options());
  int64_t stream = 0;
#if ME_TORCH_HAS_CUDA
  if (dy.is_cuda()) stream = c10::cuda::getCurrentCUDAStream(dy.device().index()).id();
#endif
  for (auto& k : kept)
    if (k.stream == stream && k.row.device() == dy.device() && k.row.scalar_type() == dy.scalar_type()) {
      if (k.row.size(1) < n) k.row = torch::ones({1, n}, dy.options());
      return k.row.narrow(1, 0, n);
    }
  kept.push_back({torch::ones({1, n}, dy.options()), stream});
  return kept.back().row;
}

// The bias gradient of y = x w^T + b from dy [rows, out]: into the sink's main grad (written, or
// added to what earlier micro-batches left there, and marked written), or with no sink (or a bias
// it does not hold) returned.
torch::Tensor compute_bias_grad(const torch::Tensor& dy, const torch::Tensor& b, MainGradSink* sink) {
  bool accumulate = false;
  if (auto main = sink ? sink->main_grad(b, &accumulate) : torch::Tensor(); main.defined()) {
    if (dy.is_cuda()) {
      // The column sums as ones^T dy, written (or added) by cuBLAS in the main grad's dtype: one
      // read of dy, measured 15% faster than LibTorch's dim-0 sum on the H100, and no separate add.
      auto row = main.view({1, -1});
      compat::matmul_into(row, ones_row(dy, dy.size(0)), dy, accumulate);
    } else {
      auto sum = dy.sum(0, /*keepdim=*/false, main.scalar_type());
      accumulate ? main.add_(sum) : main.copy_(sum);
    }
    sink->mark_written(b);
    return {};
  }
  return dy.sum(0);
}

// The weight and bias gradients of y = x w^T + b from dy [rows, out] and x [rows, in] (or, in
// fp8, q's operands): into the sink's main grads, one GEMM per micro-batch writing in their
// dtype (fp32, or bf16) and adding into what earlier micro-batches left there, each marked
// written; or, with no sink (or a weight it does not hold), returned.
std::pair<torch::Tensor, torch::Tensor> compute_weight_grads(const torch::Tensor& dy, const torch::Tensor& x,
                                                             const torch::Tensor& w, const torch::Tensor& b,
                                                             MainGradSink* sink, const std::optional<Fp8WeightGrad>& q) {
  torch::Tensor dw, db;
  bool accumulate = false;
  if (auto main = sink ? sink->main_grad(w, &accumulate) : torch::Tensor(); main.defined()) {
    if (q) kernels::fp8_gemm_nt_into(main, q->dy_t, q->x_t, accumulate);
    else if (!kernels::weight_grad_into(main, dy, x, accumulate)) compat::matmul_into(main, dy.t(), x, accumulate);
    sink->mark_written(w);
  } else {
    dw = q ? kernels::fp8_gemm_nt(q->dy_t, q->x_t, w.scalar_type()) : dy.t().mm(x);
  }
  if (b.defined()) db = compute_bias_grad(dy, b, sink);
  return {dw, db};
}

// The queue a pipeline stage holds this backward's weight gradients in (parallel.pp_deferred_wgrads;
// none inside a recomputed block's backward: WeightGradsInline), or null.
WeightGradQueue* held_back_queue(MainGradSink* sink) {
  return sink && !WeightGradsInline::active() ? sink->held_back() : nullptr;
}

// compute_weight_grads, or, when both go into the sink's main grads, the same GEMMs for later:
// queued while the sink holds weight gradients back (a pipeline schedule's
// parallel.pp_deferred_wgrads; but inside a recomputed block's backward: WeightGradsInline),
// else, with `delay`, held for the next tensor-parallel collective (DelayedWeightGrad).
std::pair<torch::Tensor, torch::Tensor> weight_grads(const torch::Tensor& dy, const torch::Tensor& x,
                                                     const torch::Tensor& w, const torch::Tensor& b,
                                                     MainGradSink* sink, const std::optional<Fp8WeightGrad>& q = {},
                                                     bool delay = false) {
  bool accumulate = false;
  auto* queue = held_back_queue(sink);
  if ((queue || (delay && sink)) && sink->main_grad(w, &accumulate).defined() &&
      (!b.defined() || sink->main_grad(b, &accumulate).defined())) {
    auto gemms = [dy, x, w, b, sink, q] {
      torch::NoGradGuard no_grad;  // as inside backward: plain GEMMs into the buffer
      compute_weight_grads(dy, x, w, b, sink, q);
    };
    if (queue) queue->push(std::move(gemms));
    else DelayedWeightGrad::hold(DelayedWeightGrad::on_own_stream(std::move(gemms), {dy, x}));
    return {};
  }
  return compute_weight_grads(dy, x, w, b, sink, q);
}

// Whether a layer communicating over `tp` holds its weight gradients for backward's next TP
// collective and runs the one held before beside its own (parallel.tp_delay_wgrad). Not while a
// pipeline stage holds them back for later (they would not be there to run beside anything).
bool delays_wgrad(const TensorParallel* tp, const LinearComm& comm) {
  return tp && tp->active() && tp->delay_wgrad && tp->sequence_parallel && tp->overlap_comm && !comm.fp8 &&
         !held_back_queue(comm.sink);
}

// The output gradient dy of a row layer, gathered over the tokens while the weight-gradient GEMM
// held from the layer before runs (DelayedWeightGrad).
torch::Tensor gathered_beside_held(const torch::Tensor& dy, const TensorParallel& tp) {
  return all_gather_beside(dy, tp, [] { DelayedWeightGrad::run(); });
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

// The tensor-parallel chunks' GEMMs (pre = x2 w^T + b, dx = dy2 w, into rows of an output) through
// cuBLASLt with kept plans where they fit (kernels::linear_rows_into): a fraction of LibTorch's
// host time per call, which at tp 4 paces the step. The bias only where it may join the epilogue.
bool chunk_linear_into(const torch::Tensor& x2, const torch::Tensor& w, const torch::Tensor& b, const torch::Tensor& into) {
  if (b.defined() && !kernels::use(kernels::Op::linear_bias, x2)) return false;
  return kernels::linear_rows_into(x2, w, b, into);
}
void input_grad_into(const torch::Tensor& dy2, const torch::Tensor& w, torch::Tensor into) {
  if (!kernels::input_grad_rows_into(dy2, w, into)) at::mm_out(into, dy2, w);
}

// The same two into existing outputs: rows x2 [n, in] into pre and act (act undefined: no GeLU).
void linear_into(const torch::Tensor& x2, const torch::Tensor& w, const torch::Tensor& b, torch::Tensor pre,
                 torch::Tensor act) {
  if (act.defined() && kernels::gemm_gelu_fits(x2, w) && kernels::linear_gelu(x2, w, b, {pre, act}).pre.defined())
    return;
  if (chunk_linear_into(x2, w, b, pre)) {
    if (act.defined()) act.copy_(torch::gelu(pre, "tanh"));
    return;
  }
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
// the partial products f(first, n) (rows first .. first + n of x times the weight, [n, cols]),
// plus the bias (once, after the sum: in place, the bits of y + b). With the overlap, each other
// rank's rows are computed and sent to it while the next rows are computed; else one GEMM, then
// one reduce-scatter.
using RowsProduct = std::function<torch::Tensor(int64_t first, int64_t n)>;
torch::Tensor reduce_scattered(const torch::Tensor& x, int64_t cols, const TensorParallel& tp, const RowsProduct& f,
                               const torch::Tensor& bias) {
  auto sizes = x.sizes().vec();
  sizes.back() = cols;
  const int64_t rows = x.numel() / x.size(-1);
  if (!tp.overlap_comm) {
    auto y = reduce_scatter_tokens(f(0, rows).view(sizes), *tp.group);
    return bias.defined() ? y.add_(bias) : y;
  }
  check_tokens_split(x, tp.size(), "sequence-parallel reduce-scatter");
  sizes[1] /= tp.size();
  return reduce_scatter_rows(rows / tp.size(), tp, f, bias).view(sizes);  // the bias in the sum's pass
}

// The product of rows of x2 and w (+ b): reduce_scattered's f in the training dtype.
RowsProduct rows_times(const torch::Tensor& x2, const torch::Tensor& w, const torch::Tensor& b) {
  return [x2, w, b](int64_t first, int64_t n) {
    const auto rows = x2.narrow(0, first, n);
    if (kernels::use(kernels::Op::chunk_gemm, rows)) {
      auto out = torch::empty({n, w.size(0)}, rows.options());
      if (chunk_linear_into(rows, w, b, out)) return out;
    }
    return linear_bias(rows, w, b);
  };
}

// The gradient of reduce_scattered's input from this rank's tokens' output gradient dy: dy
// all-gathered over the tokens (returned, for the weight gradient) while the input gradient of
// this rank's own rows is computed by rows_into, then the rest (out_cols: the input gradient's columns).
torch::Tensor gathered_grad(const torch::Tensor& dy, const TensorParallel& tp, const RowsInto& rows_into,
                            int64_t out_cols) {
  if (tp.overlap_comm) return all_gather_rows(dy, tp, rows_into, out_cols);
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

// A linear layer's weight and bias gradients in its backward (need_w, need_b: what autograd asks
// for, need_b false without a bias; nothing for a frozen layer), dy and x its output gradient and input as rows (for the
// GEMMs: weight_grads). A row layer's bias gradient under sequence parallelism comes instead from
// this rank's tokens of the output gradient, grad_out (dy before its all-gather; the gathered rows
// would count every rank's tokens), summed over the tensor-parallel group with the other
// sequence-parallel parameters' gradients (finalize_grads), as the y + b after the reduce-scatter
// it replaces was.
std::pair<torch::Tensor, torch::Tensor> layer_param_grads(const torch::Tensor& dy, const torch::Tensor& x,
                                                          const torch::Tensor& w, const torch::Tensor& b,
                                                          const torch::Tensor& grad_out, const LinearComm& comm,
                                                          const std::optional<Fp8WeightGrad>& q, bool delay,
                                                          bool need_w, bool need_b) {
  torch::Tensor dw, db;
  const bool row_bias = b.defined() && comm.row_tp();
  if (need_w || need_b)
    std::tie(dw, db) = weight_grads(dy, x, w, row_bias ? torch::Tensor() : b, comm.sink, q, delay);
  if (row_bias && need_b) db = compute_bias_grad(rows_of(grad_out), b, comm.sink);
  return {dw, db};
}

// A LinearMainGrad call: how the layer communicates, and whether GeLU joins the GEMM: after it
// (gelu: GPT's first MLP layer, bf16) or before it, inside the input's fp8 cast (gelu_input: the
// second MLP layer in fp8, whose input is then the first's output before GeLU).
struct LinearCall {
  LinearComm comm;
  bool gelu = false, gelu_input = false;
};

// LinearMainGrad's forward arithmetic, the same with autograd and without (recomputation runs
// the forward both ways and must get the same numbers): {the input as the GEMM saw it, output}.
struct LinearForward {
  torch::Tensor x;
  kernels::Activated y;
  kernels::Fp8Tensor qx;  // precision = "fp8": x cast, with its transposed copy when for_backward
};

// linear_forward in fp8: the input gathered whole (under sequence parallelism) and cast once
// (gelu_input: gelu of it), the rows' products in fp8 (a row layer's still reduce-scattered as
// they are computed).
LinearForward linear_forward_fp8(const torch::Tensor& in, const torch::Tensor& w, const torch::Tensor& b,
                                 const LinearComm& comm, bool for_backward, bool gelu_input) {
  LinearForward f;
  const auto* tp = comm.column_tp();
  f.x = tp && tp->sequence_parallel ? all_gather_tokens(in, *tp->group) : in;
  const auto x2 = rows_of(f.x);
  kernels::check_fp8_aligned(x2.size(0), "the number of rows (tokens) of a linear layer's input");
  f.qx = kernels::fp8_cast(x2, comm.fp8->scales.input, /*transposed=*/for_backward, gelu_input);
  const auto qx = f.qx.matrix(), qw = comm.fp8->weight(w).matrix();
  const auto dtype = in.scalar_type();
  const auto* out_tp = comm.row_tp();
  const auto partial_bias = out_tp ? torch::Tensor() : b;  // a row layer's bias: once, after the sum
  const RowsProduct product = [&](int64_t first, int64_t n) {
    return kernels::fp8_gemm_nt(qx.rows(first, n), qw, dtype, partial_bias, /*fast_accum=*/true);
  };
  if (out_tp) {
    f.y.pre = reduce_scattered(f.x, w.size(0), *out_tp, product, b);
  } else {
    auto sizes = f.x.sizes().vec();
    sizes.back() = w.size(0);
    f.y.pre = product(0, x2.size(0)).view(sizes);
  }
  return f;
}

// for_backward: the forward of an autograd function, which keeps what its backward needs.
LinearForward linear_forward(const torch::Tensor& in, const torch::Tensor& w, const torch::Tensor& b,
                             const LinearComm& comm, bool gelu, bool for_backward, bool gelu_input = false) {
  if (comm.fp8) return linear_forward_fp8(in, w, b, comm, for_backward, gelu_input);
  ME_CHECK(!gelu_input, "linear: GeLU inside the input's cast is fp8's");
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
    }, w.size(0));
    return f;
  }
  f.x = tp && tp->sequence_parallel ? all_gather_tokens(in, *tp->group) : in;
  if (const auto* out_tp = comm.row_tp()) f.y.pre = reduce_scattered(f.x, w.size(0), *out_tp, rows_times(rows_of(f.x), w, {}), b);
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

// LinearMainGrad's input gradient in fp8: the output gradient (gathered whole over the tokens for
// a row layer: its cast needs all of it) cast to E5M2, dx = dy W from the weight's cached
// transposed cast. Returns dy's rows, dx (the input's shape) and the weight gradient's operands.
struct Fp8InputGrad {
  torch::Tensor dy, dx;
  Fp8WeightGrad wgrad;
};
Fp8InputGrad fp8_input_grad(AutogradContext* ctx, const torch::Tensor& grad, const torch::Tensor& x_t,
                            const torch::Tensor& w, const LinearComm& comm) {
  const auto* out_tp = comm.row_tp();
  const auto dy = rows_of(out_tp ? all_gather_tokens(grad.contiguous(), *out_tp->group) : grad);
  const auto qdy = kernels::fp8_cast(dy, comm.fp8->scales.grad_output, /*transposed=*/true);
  auto dx = kernels::fp8_gemm_nt(qdy.matrix(), comm.fp8->weight(w).transposed(), grad.scalar_type());
  const kernels::Fp8Matrix x_t_matrix{x_t, ctx->saved_data["x_scale_inv"].toTensor(), kernels::Fp8::e4m3};
  return {dy, dx.view(ctx->saved_data["x_sizes"].toIntVector()), {qdy.transposed(), x_t_matrix}};
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
    auto f = linear_forward(in[0], in[1], b, comm, gelu, /*for_backward=*/true, call.gelu_input);
    if (call.gelu_input) ctx->saved_data["pre"] = in[0];  // gelu'(pre), in backward
    auto saved = in.vec();
    saved[0] = f.x;
    if (comm.fp8) {  // x^T in fp8 is all the weight gradient reads: kept instead of x, at 1 byte
      saved[0] = f.qx.data_t;
      ctx->saved_data["x_scale_inv"] = f.qx.scale_inv;
      ctx->saved_data["x_sizes"] = f.x.sizes().vec();
    }
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
    const auto* tp = comm.column_tp();
    const bool delay = delays_wgrad(tp ? tp : comm.row_tp(), comm);
    torch::Tensor dy, dx;
    std::optional<Fp8WeightGrad> q;
    if (comm.fp8) {
      auto g = fp8_input_grad(ctx, grads[0], x, w, comm);
      dy = g.dy, dx = g.dx, q = g.wgrad;
      if (ctx->saved_data.count("pre")) dx = at::gelu_backward(dx, ctx->saved_data["pre"].toTensor(), "tanh");
    } else if (const auto* out_tp = comm.row_tp(); out_tp && delay) {
      dy = rows_of(gathered_beside_held(grads[0].contiguous(), *out_tp));
      dx = dy.mm(w).view(x.sizes());
    } else if (const auto* out_tp = comm.row_tp()) {
      dx = torch::empty(x.sizes(), x.options());
      const auto dx2 = rows_in(dx);
      dy = rows_of(gathered_grad(grads[0].contiguous(), *out_tp, [&](const torch::Tensor& rows, int64_t first) {
        input_grad_into(rows, w, dx2.narrow(0, first, rows.size(0)));
      }, w.size(1)));
    } else {
      dy = rows_of(grads[0]);
      dx = dy.mm(w).view(x.sizes());
    }
    std::function<void()> join = [] {};
    if (tp) reduce_input_grad(dx, *tp, join);
    std::optional<SmMarginForCollective> margin;
    if (tp && tp->overlap_comm) margin.emplace(dy, *tp);  // the reduction runs beside
    if (tp && delay) DelayedWeightGrad::run();           // the layer before's GEMM, beside it
    const auto [dw, db] = layer_param_grads(dy, q ? torch::Tensor() : rows_of(x), w, b, grads[0], comm, q, delay,
                                            ctx->needs_input_grad(1), b.defined() && ctx->needs_input_grad(2));
    margin.reset();
    join();
    return input_grads({dx, dw, db});
  }
};

// GeluLinearMainGrad's forward, with autograd or without.
torch::Tensor gelu_linear_forward(const torch::Tensor& act, const torch::Tensor& w, const torch::Tensor& b,
                                  const LinearComm& comm) {
  if (const auto* out_tp = comm.row_tp()) return reduce_scattered(act, w.size(0), *out_tp, rows_times(rows_of(act), w, {}), b);
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
    const bool delay = delays_wgrad(comm.row_tp(), comm);
    if (const auto* out_tp = comm.row_tp(); out_tp && delay) {
      dy = rows_of(gathered_beside_held(grads[0].contiguous(), *out_tp));
      rows_into(dy, 0);
    } else if (const auto* out_tp = comm.row_tp()) {
      dy = rows_of(gathered_grad(grads[0].contiguous(), *out_tp, rows_into, w.size(1)));
    } else {
      dy = rows_of(grads[0]);
      rows_into(dy, 0);
    }
    const auto [dw, db] = layer_param_grads(dy, rows_of(act), w, b, grads[0], comm, {}, delay, ctx->needs_input_grad(2),
                                            b.defined() && ctx->needs_input_grad(3));
    return input_grads({dpre, torch::Tensor(), dw, db});
  }
};

// A row layer's output is reduce-scattered inside the GEMM's function only under sequence
// parallelism (without it the layer all-reduces after the GEMM, and the caller adds the bias);
// its bias is added once, after the reduce-scatter (reduce_scattered).
void check_row(const LinearComm& comm) {
  if (!comm.row_tp()) return;
  ME_CHECK(comm.tp->sequence_parallel, "linear: a row role is for sequence parallelism (without it the layer all-reduces)");
}

// linear, or with gelu_input (fp8) linear_of_gelu.
torch::Tensor linear_call(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, const LinearComm& comm,
                          bool gelu_input) {
  check_row(comm);
  const bool communicates = comm.column_tp() || comm.row_tp();
  if (!communicates && !comm.fp8 && (!comm.sink || !torch::GradMode::is_enabled() || !w.requires_grad()))
    return linear_bias(x, w, b);
  if (!torch::GradMode::is_enabled() || (comm.fp8 && !w.requires_grad() && !x.requires_grad()))
    return linear_forward(x, w, b, comm, false, /*for_backward=*/false, gelu_input).y.pre;
  const auto in = b.defined() ? variable_list{x, w, b} : variable_list{x, w};
  // As a TensorList: a std::vector would be taken for a non-tensor argument (no gradient).
  return LinearMainGrad::apply(at::TensorList(in), LinearCall{comm, false, gelu_input})[0];
}
}  // namespace

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, const LinearComm& comm) {
  return linear_call(x, w, b, comm, /*gelu_input=*/false);
}

torch::Tensor linear_of_gelu(const torch::Tensor& pre, const torch::Tensor& w, const torch::Tensor& b,
                             const LinearComm& comm) {
  ME_CHECK(comm.fp8, "linear_of_gelu: GeLU inside the input's cast is fp8's (elsewhere: linear of torch::gelu)");
  return linear_call(pre, w, b, comm, /*gelu_input=*/true);
}

kernels::Activated linear_gelu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                               const LinearComm& comm) {
  ME_CHECK(comm.role != LinearComm::Role::row, "linear_gelu: the GeLU epilogue is a column (or local) layer's");
  ME_CHECK(!comm.fp8, "linear_gelu: no GeLU epilogue in fp8 (forward_gelu composes instead)");
  if (!torch::GradMode::is_enabled()) return linear_forward(x, w, b, comm, true, /*for_backward=*/false).y;
  const auto in = b.defined() ? variable_list{x, w, b} : variable_list{x, w};
  auto out = LinearMainGrad::apply(at::TensorList(in), LinearCall{comm, true});
  return {out[0], out[1]};
}

torch::Tensor gelu_linear(const kernels::Activated& a, const torch::Tensor& w, const torch::Tensor& b,
                          const LinearComm& comm) {
  ME_CHECK(comm.role != LinearComm::Role::column, "gelu_linear: the dGeLU epilogue is a row (or local) layer's");
  ME_CHECK(!comm.fp8, "gelu_linear: no dGeLU epilogue in fp8 (forward_gelu composes instead)");
  check_row(comm);
  if (!torch::GradMode::is_enabled() || (!w.requires_grad() && !a.pre.requires_grad()))
    return gelu_linear_forward(a.out, w, b, comm);
  const auto in = b.defined() ? variable_list{a.pre, a.out, w, b} : variable_list{a.pre, a.out, w};
  return GeluLinearMainGrad::apply(at::TensorList(in), comm);
}

}  // namespace me::parallel
