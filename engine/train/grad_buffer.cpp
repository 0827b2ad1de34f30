#include "engine/train/grad_buffer.h"

#include "engine/core/error.h"

#if ME_TORCH_HAS_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace me::train {

GradBuffer::GradBuffer(const std::vector<torch::Tensor>& params, comm::ProcessGroup* dp, double bucket_mb,
                       bool shard_reduce)
    : params_(params), dp_(dp && dp->size() > 1 ? dp : nullptr), shard_reduce_(shard_reduce),
      alive_(std::make_shared<bool>(true)) {
  dp_size_ = dp_ ? dp_->size() : 1;
  dp_rank_ = dp_ ? dp_->rank() : 0;
  // Buckets are filled in reverse parameter order: backward produces the last layers' grads
  // first, so the first buckets complete (and start communicating) earliest.
  const int64_t bucket_elems = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024 * 1024 / 4));
  int64_t total = 0;
  offsets_.resize(params_.size());
  written_.assign(params_.size(), 0);
  bucket_of_.resize(params_.size());
  for (size_t k = params_.size(); k-- > 0;) {
    offsets_[k] = total;
    if (buckets_.empty() || buckets_.back().length >= bucket_elems) buckets_.push_back({total, 0});
    buckets_.back().length += params_[k].numel();
    buckets_.back().size += 1;
    bucket_of_[k] = buckets_.size() - 1;
    total += params_[k].numel();
  }
  const int64_t padded = (total + dp_size_ - 1) / dp_size_ * dp_size_;
  flat_ = torch::zeros({padded}, torch::TensorOptions().dtype(torch::kFloat).device(params_.front().device()));
  if (padded > total) buckets_.back().length += padded - total;  // the padding travels with the last bucket

  std::weak_ptr<bool> alive = alive_;
  for (size_t i = 0; i < params_.size(); ++i) {
    index_[params_[i].unsafeGetTensorImpl()] = i;
    params_[i].register_hook([this, i, alive](torch::Tensor g) {
      if (alive.lock()) on_grad(i, g);
      return torch::Tensor();
    });
  }
}

GradBuffer::~GradBuffer() { *alive_ = false; }

torch::Tensor GradBuffer::view(size_t i) const { return flat_.narrow(0, offsets_[i], params_[i].numel()).view_as(params_[i]); }

void GradBuffer::begin_step() { std::fill(written_.begin(), written_.end(), 0); }

void GradBuffer::begin_micro_batch(bool last) {
  last_ = last;
  for (auto& b : buckets_) b.pending = b.size;
}

torch::Tensor GradBuffer::main_grad(const torch::Tensor& param, bool* accumulate) {
  const auto it = index_.find(param.unsafeGetTensorImpl());
  if (it == index_.end()) return {};
  *accumulate = written_[it->second] != 0;
  return view(it->second);
}

void GradBuffer::mark_written(const torch::Tensor& param) { arrived(index_.at(param.unsafeGetTensorImpl())); }

void GradBuffer::on_grad(size_t i, const torch::Tensor& g) {
  if (!g.defined()) return;  // written into the buffer by its layer (gradient-accumulation fusion)
  // One kernel either way: the bf16 gradient is widened inside the copy or the add.
  if (!written_[i]) view(i).copy_(g);
  else view(i).add_(g);
  arrived(i);
}

void GradBuffer::arrived(size_t i) {
  written_[i] = 1;
  auto& b = buckets_[bucket_of_[i]];
  ME_CHECK(b.pending > 0, "gradient buffer: parameter ", i, " reported its gradient twice in one micro-batch ",
           "(a weight shared by two fused linear layers?)");
  if (--b.pending == 0 && last_ && dp_ && !shard_reduce_) {
    auto slice = flat_.narrow(0, b.start, b.length);
#if ME_TORCH_HAS_CUDA
    if (flat_.is_cuda()) {
      // On a side stream, so the rest of backward runs meanwhile; that stream first waits for
      // everything queued so far on this one (the bucket's gradients). finish() makes the
      // compute stream wait for the reductions.
      if (!comm_stream_)
        comm_stream_ = std::make_shared<c10::cuda::CUDAStream>(
            c10::cuda::getStreamFromPool(/*isHighPriority=*/true, flat_.device().index()));
      at::cuda::CUDAEvent ready;
      ready.record();
      ready.block(*comm_stream_);
      c10::cuda::CUDAStreamGuard guard(*comm_stream_);
      b.work = dp_->all_reduce(slice, comm::ReduceOp::avg, /*async=*/true);
      return;
    }
#endif
    b.work = dp_->all_reduce(slice, comm::ReduceOp::avg, /*async=*/true);
  }
}

void GradBuffer::finish() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (!written_[i]) view(i).zero_();  // unused this step (its bucket is reduced below)
  if (!dp_) return;
  if (shard_reduce_) {
    auto shard = flat_.narrow(0, shard_start(), shard_size());
    auto reduced = torch::empty_like(shard);
    dp_->reduce_scatter(reduced, flat_, comm::ReduceOp::avg);
    shard.copy_(reduced);
    return;
  }
  for (auto& b : buckets_) {
    if (!b.work) {  // a bucket whose params got no gradient: reduce it now
      auto slice = flat_.narrow(0, b.start, b.length);
      b.work = dp_->all_reduce(slice, comm::ReduceOp::avg, true);
    }
    b.work->wait();
    b.work.reset();
  }
}

}  // namespace me::train
