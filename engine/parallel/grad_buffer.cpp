#include "engine/parallel/grad_buffer.h"

#include "engine/core/error.h"
#include "engine/core/graph_capture.h"

#include <utility>

namespace me::parallel {

GradBuffer::GradBuffer(const std::vector<torch::Tensor>& params, comm::ProcessGroup* dp, double bucket_mb,
                       bool shard_reduce, bool symmetric, torch::ScalarType dtype)
    : params_(params), dp_(dp && dp->size() > 1 ? dp : nullptr), shard_reduce_(shard_reduce),
      alive_(std::make_shared<bool>(true)) {
  ME_CHECK(dtype == torch::kFloat || dtype == torch::kBFloat16, "gradient buffer: fp32 or bf16, got ", dtype);
  dp_size_ = dp_ ? dp_->size() : 1;
  dp_rank_ = dp_ ? dp_->rank() : 0;
  // Buckets are filled in reverse parameter order: backward produces the last layers' grads
  // first, so the first buckets complete (and start communicating) earliest. Reduce-scattered
  // buckets are padded to a multiple of the dp size, so that each rank's piece is whole.
  const int64_t bucket_elems =
      std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024 * 1024 / c10::elementSize(dtype)));
  const int64_t align = shard_reduce_ ? dp_size_ : 1;
  auto& l = layout_;
  auto close_bucket = [&] {
    auto& last = l.buckets.back();
    last.length = (last.length + align - 1) / align * align;
    l.numel = last.start + last.length;
  };
  l.offsets.resize(params_.size());
  written_.assign(params_.size(), 0);
  bucket_of_.resize(params_.size());
  for (size_t k = params_.size(); k-- > 0;) {
    if (l.buckets.empty() || l.buckets.back().length >= bucket_elems) {
      if (!l.buckets.empty()) close_bucket();
      l.buckets.push_back({l.numel, 0});
      buckets_.emplace_back();
    }
    l.offsets[k] = l.numel + l.buckets.back().length;
    l.buckets.back().length += params_[k].numel();
    buckets_.back().size += 1;
    bucket_of_[k] = buckets_.size() - 1;
  }
  close_bucket();
  const auto options = torch::TensorOptions().dtype(dtype).device(params_.front().device());
  flat_ = symmetric && dp_ ? dp_->empty_symmetric(l.numel, options) : torch::zeros({l.numel}, options);
  if (symmetric && dp_) symmetric_bytes_ += flat_.nbytes();

  std::weak_ptr<bool> alive = alive_;
  for (size_t i = 0; i < params_.size(); ++i) {
    index_[params_[i].unsafeGetTensorImpl()] = i;
    params_[i].register_hook([this, i, alive](torch::Tensor g) {
      if (alive.lock()) on_grad(i, g);
      return torch::Tensor();
    });
  }
}

GradBuffer::~GradBuffer() {
  *alive_ = false;
  // Memory from empty_symmetric goes with the DP group: parameters that outlive this buffer (a
  // model kept after its trainer) get their own copy first.
  if (params_symmetric_) {
    torch::NoGradGuard no_grad;
    for (auto& p : params_) p.set_data(p.detach().clone());
  }
}

torch::Tensor GradBuffer::view(size_t i) const {
  return flat_.narrow(0, layout_.offsets[i], params_[i].numel()).view_as(params_[i]);
}

std::vector<torch::Tensor> GradBuffer::reduced_views(size_t i) const {
  if (!dp_ || !shard_reduce_) return {view(i)};
  const parallel::FlatRange param{layout_.offsets[i], params_[i].numel()};
  std::vector<torch::Tensor> out;
  for (const auto& r : layout_.shard(dp_rank_, dp_size_))
    if (const auto part = param.within(r); part.length > 0) out.push_back(flat_.narrow(0, part.start, part.length));
  return out;
}

void GradBuffer::defer(size_t i) { buckets_[bucket_of_[i]].deferred = true; }

torch::Tensor GradBuffer::adopt_params(bool symmetric) {
  torch::NoGradGuard no_grad;
  const auto options = params_.front().options().requires_grad(false);
  params_symmetric_ = symmetric && dp_;
  auto flat = params_symmetric_ ? dp_->empty_symmetric(layout_.numel, options) : torch::zeros({layout_.numel}, options);
  if (params_symmetric_) symmetric_bytes_ += flat.nbytes();
  for (size_t i = 0; i < params_.size(); ++i) {
    ME_CHECK(params_[i].scalar_type() == flat.scalar_type(), "the distributed optimizer needs every parameter in one ",
             "dtype; parameter ", i, " is ", params_[i].scalar_type(), ", the first ", flat.scalar_type());
    auto v = flat.narrow(0, layout_.offsets[i], params_[i].numel()).view_as(params_[i]);
    v.copy_(params_[i]);
    params_[i].set_data(v);  // same TensorImpl (hooks, index_ stay valid), new storage
  }
  return flat;
}

void GradBuffer::begin_step(int64_t micro_batches) {
  ME_CHECK(micro_batches > 0, "gradient buffer: a step needs at least one micro-batch, got ", micro_batches);
  std::fill(written_.begin(), written_.end(), zero_each_step_ ? 1 : 0);
  if (zero_each_step_) flat_.zero_();
  for (auto& b : buckets_) b.pending = b.size * micro_batches;
}

std::vector<torch::Tensor> GradBuffer::take_captured_writes() { return std::exchange(captured_writes_, {}); }

torch::Tensor GradBuffer::main_grad(const torch::Tensor& param, bool* accumulate) {
  const auto it = index_.find(param.unsafeGetTensorImpl());
  if (it == index_.end()) return {};
  *accumulate = written_[it->second] != 0;
  return view(it->second);
}

void GradBuffer::mark_written(const torch::Tensor& param) {
  if (graph_capture_underway()) {
    captured_writes_.push_back(param);
    return;
  }
  arrived(index_.at(param.unsafeGetTensorImpl()));
}

void GradBuffer::mark_partly_written(const torch::Tensor& param) { written_[index_.at(param.unsafeGetTensorImpl())] = 1; }

void GradBuffer::on_grad(size_t i, const torch::Tensor& g) {
  if (!g.defined()) return;  // written into the buffer by its layer (gradient-accumulation fusion)
  if (graph_capture_underway()) return;  // the graph's output: this hook runs again at each replay
  // One kernel either way: the gradient is converted (if need be) inside the copy or the add.
  if (!written_[i]) view(i).copy_(g);
  else view(i).add_(g);
  arrived(i);
}

void GradBuffer::arrived(size_t i) {
  written_[i] = 1;
  auto& b = buckets_[bucket_of_[i]];
  ME_CHECK(b.pending > 0, "gradient buffer: parameter ", i, " reported more gradients than the step has micro-batches ",
           "(a weight shared by two fused linear layers?)");
  if (--b.pending == 0 && dp_ && !b.deferred) reduce(bucket_of_[i]);
}

void GradBuffer::reduce(size_t k) {
  auto& b = buckets_[k];
  const auto& r = layout_.buckets[k];
  auto slice = flat_.narrow(0, r.start, r.length);
  auto start = [&] {
    if (!shard_reduce_) return dp_->all_reduce(slice, comm::ReduceOp::avg, /*async=*/true);
    // In place: this rank's piece of the bucket receives the average of everyone's.
    const auto mine = layout_.piece(k, dp_rank_, dp_size_);
    auto piece = flat_.narrow(0, mine.start, mine.length);
    return dp_->reduce_scatter(piece, slice, comm::ReduceOp::avg, /*async=*/true);
  };
  // On the GPU on a side stream, so the rest of backward runs meanwhile, after the bucket's
  // gradients, those the held weight-gradient GEMMs wrote on a stream of their own included
  // (ME_TP_WGRAD_STREAM: the fence makes the reduction's stream, not the compute stream, wait for
  // them); finish() makes the compute stream wait for the reductions.
  comm_stream_.run(flat_.device(), [&] {
    DelayedWeightGrad::fence();
    b.work = start();
  });
}

void GradBuffer::finish(const std::function<void()>& before_deferred) {
  for (size_t i = 0; i < params_.size(); ++i)
    if (!written_[i]) view(i).zero_();  // unused this step (its bucket is reduced below)
  auto reduce_all = [&](bool deferred) {
    if (!dp_) return;
    for (size_t k = 0; k < buckets_.size(); ++k)
      if (buckets_[k].deferred == deferred && !buckets_[k].work) reduce(k);  // one whose params got no gradient
    for (auto& b : buckets_)
      if (b.deferred == deferred) {
        b.work->wait();
        b.work.reset();
      }
  };
  reduce_all(false);
  if (before_deferred) before_deferred();
  reduce_all(true);
}

}  // namespace me::parallel
