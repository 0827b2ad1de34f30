#include "engine/model/block_graphs.h"

#include "engine/core/autograd_state.h"
#include "engine/core/build_config.h"  // ME_HAVE_CUDA_KERNELS
#include "engine/core/error.h"
#include "engine/core/format.h"
#include "engine/core/graph_capture.h"
#include "engine/core/torch_compat.h"
#include "engine/parallel/main_grad.h"

#if ME_TORCH_HAS_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
#if ME_HAVE_CUDA_KERNELS
#include "engine/kernels/kernels.h"
#include "engine/kernels/peer_buffers.h"
#endif

namespace me::model {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#if ME_TORCH_HAS_CUDA

bool block_graphs_built() { return true; }

namespace {

// A static tensor for `value` at capture: `chained` itself when `value` is it (the neighbouring
// block's static output or input gradient: same memory, nothing to copy), else a copy of its own.
torch::Tensor static_for(const torch::Tensor& value, const std::vector<torch::Tensor>& chained) {
  for (const auto& c : chained)
    if (c.defined() && c.data_ptr() == value.data_ptr() && c.sizes() == value.sizes()) return c;
  return value.detach().clone();
}

// Copies `value` into static tensor `into` unless it is already there. Through variable_data:
// a copy into the tensor itself would bump a version counter that a capture's saved tensors share.
void copy_in(const torch::Tensor& into, const torch::Tensor& value, size_t block, const char* what) {
  if (!into.defined() || into.data_ptr() == value.data_ptr()) return;
  ME_CHECK(into.sizes() == value.sizes(), "train.cuda_graphs: block ", block, "'s ", what, " is ", value.sizes(),
           " but its graph was captured for ", into.sizes(), "; every micro-batch must have the same shape");
  into.variable_data().copy_(value);
}

}  // namespace

// One block's graphs and the static tensors they read and write.
struct Graphed {
  at::cuda::CUDAGraph forward, backward;
  bool has_delta = false, forward_captured = false, backward_captured = false;
  // Collectives on the copy engines inside each graph, and the parity of the host's count when it
  // was captured: what a replay must start from and moves it on by.
  uint64_t forward_slots = 0, backward_slots = 0;
  int forward_parity = 0, backward_parity = 0;
  torch::Tensor in_x, in_delta, out_x, out_delta;        // static input and output
  torch::Tensor grad_out_x, grad_out_delta, grad_in_x, grad_in_delta;  // and their gradients
  std::vector<torch::Tensor> params, param_grads;        // param_grads[k] undefined: a main grad
  std::vector<torch::Tensor> written;                    // whose main grads backward writes
  // Between the two captures: the captured forward's autograd graph.
  torch::Tensor leaf_x, leaf_delta, inner_x, inner_delta;
};

struct BlockGraphs::Impl {
  parallel::TensorParallel tp;
  GraphGradHooks hooks;
  std::vector<std::unique_ptr<Graphed>> blocks;
  bool armed = false;
  decltype(at::cuda::graph_pool_handle()) pool{0, 0};  // a pair of ids; {0, 0}: none yet
  std::optional<c10::cuda::CUDAStream> capture_stream;
  int64_t pool_bytes = 0;

  // The copy engines' collectives so far (the peer buffers' slot count), 0 without them.
  uint64_t collectives() const {
#if ME_HAVE_CUDA_KERNELS
    if (tp.peers) return tp.peers->collectives();
#endif
    return 0;
  }

  // Captures `work` into `graph` on a stream of its own (a capture needs one that is not the
  // default stream), in the blocks' memory pool.
  void capture(at::cuda::CUDAGraph& graph, const std::function<void()>& work, uint64_t* slots, int* parity, size_t i,
               const char* what) {
    if (!capture_stream) {
      // Its own, never destroyed (the graphs' work was captured on it), and non-blocking: the
      // legacy default stream must not sync with it implicitly while it captures.
      cudaStream_t created = nullptr;
      C10_CUDA_CHECK(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
      capture_stream = c10::cuda::getStreamFromExternal(created, c10::cuda::current_device());
#if ME_HAVE_CUDA_KERNELS
      kernels::reserve_gemm_workspace(capture_stream->stream());  // no cudaMalloc inside a capture
#endif
    }
    const uint64_t before = collectives();
    *parity = static_cast<int>(before % 2);
    const auto allocated = compat::cuda_memory().allocated;
    {
      c10::cuda::CUDAStreamGuard guard(*capture_stream);
      GraphCaptureScope scope;
      compat::graph_capture_begin(graph, pool);
      try {
        work();
      } catch (const std::exception& e) {
        try {
          graph.capture_end();
        } catch (...) {
        }
        throw Error(cat("train.cuda_graphs: capturing block ", i, "'s ", what, " failed: ", e.what(),
                        "\nset train.cuda_graphs = false to train without CUDA graphs"));
      }
      graph.capture_end();
    }
    if (pool.first == 0 && pool.second == 0) pool = graph.pool();  // the first capture's, shared by the others
    pool_bytes += compat::cuda_memory().allocated - allocated;
    *slots = collectives() - before;
  }

  // Captures block i's forward from input `in` (its static input then holds `in`). Before the
  // autograd function that replays it is applied, not inside: the function's edges to the
  // parameters would make their gradient accumulators on the current stream, and the captured
  // backward's gradients for them would then have to cross from the capture stream to that one,
  // which a capture cannot do. Made here, inside the capture, they follow the capture stream.
  void capture_forward(size_t i, BlockImpl& block, const Residual& in) {
    auto& g = *blocks[i];
    g.has_delta = in.delta.defined();
    std::vector<torch::Tensor> before;  // the previous block's static output
    if (i > 0) before = {blocks[i - 1]->out_x, blocks[i - 1]->out_delta};
    g.in_x = static_for(in.x, before);
    if (g.has_delta) g.in_delta = static_for(in.delta, before);
    capture(g.forward, [&] {
      torch::AutoGradMode grad(true);
      g.leaf_x = g.in_x.detach().requires_grad_(true);
      if (g.has_delta) g.leaf_delta = g.in_delta.detach().requires_grad_(true);
      const auto out = block.forward(Residual{g.leaf_x, g.leaf_delta});
      g.inner_x = out.x, g.inner_delta = out.delta;
    }, &g.forward_slots, &g.forward_parity, i, "forward");
    ME_CHECK(g.inner_delta.defined(), "train.cuda_graphs: block ", i, " returned no pending addition");
    g.out_x = g.inner_x.detach(), g.out_delta = g.inner_delta.detach();
    g.forward_captured = true;
  }

  // Replays `graph` on the current stream, with the peer buffers' slots it was captured with.
  void replay(at::cuda::CUDAGraph& graph, uint64_t slots, int parity) {
#if ME_HAVE_CUDA_KERNELS
    if (auto* p = tp.peers; p && slots > 0) {
      if (static_cast<int>(p->collectives() % 2) != parity) {
        // The slot the graph's first collective writes is the one the last collective used: every
        // rank must be done with it (a barrier), and the host's count passes over one.
        p->barrier(c10::cuda::getCurrentCUDAStream().stream());
        p->skip_slot();
      }
      graph.replay();
      for (uint64_t k = 0; k < slots; ++k) p->skip_slot();
      return;
    }
#endif
    (void)slots, (void)parity;
    graph.replay();
  }
};

namespace {

struct Call {
  BlockGraphs::Impl* impl;
  size_t i;
  BlockImpl* block;
};

// One block through its graphs: in = x, then delta if the stream has one, then the block's
// parameters (so that autograd hands their gradients, the graph's outputs, to their hooks).
// Its forward replays the graph BlockGraphs::forward has captured.
struct GraphedBlock : public torch::autograd::Function<GraphedBlock> {
  static variable_list forward(AutogradContext* ctx, at::TensorList in, Call call) {
    auto& impl = *call.impl;
    auto& g = *impl.blocks[call.i];
    const bool has_delta = in.size() > g.params.size() + 1;
    const auto& x = in[0];
    const torch::Tensor delta = has_delta ? in[1] : torch::Tensor();
    save_state(ctx, "call", call);
    ME_CHECK(g.forward_captured && has_delta == g.has_delta, "train.cuda_graphs: block ", call.i,
             "'s forward is not captured for this input");
    copy_in(g.in_x, x, call.i, "input");
    copy_in(g.in_delta, delta, call.i, "input");
    impl.replay(g.forward, g.forward_slots, g.forward_parity);
    return {g.out_x.detach(), g.out_delta.detach()};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto& call = saved_state<Call>(ctx, "call");
    auto& impl = *call.impl;
    auto& g = *impl.blocks[call.i];
    // A weight-gradient GEMM held by what ran before (the output layer's) runs now, outside the
    // graph; the graph runs its own blocks' held GEMMs inside.
    parallel::DelayedWeightGrad::run();
    parallel::DelayedWeightGrad::join();
    if (!g.backward_captured) {
      std::vector<torch::Tensor> after;  // the next block's static input gradients
      if (call.i + 1 < impl.blocks.size()) after = {impl.blocks[call.i + 1]->grad_in_x, impl.blocks[call.i + 1]->grad_in_delta};
      g.grad_out_x = static_for(grads[0], after);
      g.grad_out_delta = static_for(grads[1], after);
      if (impl.hooks.take_captured_writes) impl.hooks.take_captured_writes();  // nothing of another capture
      std::vector<torch::Tensor> result;
      impl.capture(g.backward, [&] {
        std::vector<torch::Tensor> inputs{g.leaf_x};
        if (g.has_delta) inputs.push_back(g.leaf_delta);
        inputs.insert(inputs.end(), g.params.begin(), g.params.end());
        result = torch::autograd::grad({g.inner_x, g.inner_delta}, inputs, {g.grad_out_x, g.grad_out_delta},
                                       /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
        parallel::DelayedWeightGrad::run();  // this block's last held GEMM, inside its graph
        parallel::DelayedWeightGrad::join();
      }, &g.backward_slots, &g.backward_parity, call.i, "backward");
      if (impl.hooks.take_captured_writes) g.written = impl.hooks.take_captured_writes();
      size_t k = 0;
      g.grad_in_x = result[k++];
      if (g.has_delta) g.grad_in_delta = result[k++];
      for (size_t p = 0; p < g.params.size(); ++p) g.param_grads.push_back(result[k++]);
      g.leaf_x = g.leaf_delta = g.inner_x = g.inner_delta = torch::Tensor();  // the capture freed their graph
      g.backward_captured = true;
    } else {
      copy_in(g.grad_out_x, grads[0], call.i, "output gradient");
      copy_in(g.grad_out_delta, grads[1], call.i, "output gradient");
    }
    impl.replay(g.backward, g.backward_slots, g.backward_parity);
    if (impl.hooks.mark_written)
      for (const auto& p : g.written) impl.hooks.mark_written(p);
    variable_list out{g.grad_in_x.defined() ? g.grad_in_x.detach() : torch::Tensor()};
    if (g.has_delta) out.push_back(g.grad_in_delta.defined() ? g.grad_in_delta.detach() : torch::Tensor());
    for (const auto& pg : g.param_grads) out.push_back(pg.defined() ? pg.detach() : torch::Tensor());
    out.emplace_back();  // Call
    return out;
  }
};

}  // namespace

BlockGraphs::BlockGraphs(const TensorParallel& tp, size_t blocks, GraphGradHooks hooks) : impl_(std::make_unique<Impl>()) {
  impl_->tp = tp;
  impl_->hooks = std::move(hooks);
  for (size_t i = 0; i < blocks; ++i) impl_->blocks.push_back(std::make_unique<Graphed>());
}

Residual BlockGraphs::forward(size_t i, BlockImpl& block, const Residual& in) {
  if (!impl_->armed || !torch::GradMode::is_enabled()) return block.forward(in);
  ME_CHECK(i < impl_->blocks.size(), "train.cuda_graphs: block ", i, " of ", impl_->blocks.size());
  auto& g = *impl_->blocks[i];
  if (g.params.empty())
    for (const auto& p : block.parameters())
      if (p.requires_grad()) g.params.push_back(p);
  if (!g.forward_captured) impl_->capture_forward(i, block, in);
  std::vector<torch::Tensor> args{in.x};
  if (in.delta.defined()) args.push_back(in.delta);
  args.insert(args.end(), g.params.begin(), g.params.end());
  const auto out = GraphedBlock::apply(at::TensorList(args), Call{impl_.get(), i, &block});
  return {out[0], out[1]};
}

void BlockGraphs::arm() {
  // In the capture's micro-batch the parameters' accumulators follow the capture stream while
  // the replays' gradients come from the compute stream: autograd orders the two itself, and
  // would warn that this "may break CUDA graph capture", which here it cannot (capture_forward).
  compat::set_warn_on_accumulate_grad_stream_mismatch(false);
  impl_->armed = true;
}

bool BlockGraphs::armed() const { return impl_->armed; }

std::string BlockGraphs::describe() const {
  size_t forwards = 0, backwards = 0;
  for (const auto& g : impl_->blocks) forwards += g->forward_captured, backwards += g->backward_captured;
  return cat(impl_->blocks.size(), " blocks: ", forwards, " forwards and ", backwards, " backwards captured (",
             human::number(static_cast<double>(impl_->pool_bytes) / 1048576.0), " MiB in their memory pool)");
}

#else  // no CUDA in this LibTorch: the trainer refuses train.cuda_graphs before building one

bool block_graphs_built() { return false; }

struct BlockGraphs::Impl {};

BlockGraphs::BlockGraphs(const TensorParallel&, size_t, GraphGradHooks) : impl_(std::make_unique<Impl>()) {}

Residual BlockGraphs::forward(size_t, BlockImpl& block, const Residual& in) { return block.forward(in); }

void BlockGraphs::arm() { throw Error("train.cuda_graphs: this build's LibTorch has no CUDA"); }

bool BlockGraphs::armed() const { return false; }

std::string BlockGraphs::describe() const { return "no CUDA graphs in this build"; }

#endif

BlockGraphs::~BlockGraphs() = default;

}  // namespace me::model
