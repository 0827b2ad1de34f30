// Data-parallel gradients: one flat fp32 "main grad" buffer over this rank's parameters,
// filled by a hook per parameter (so micro-batches accumulate in fp32 whatever the parameter
// dtype), split into buckets that are averaged over the data-parallel group as soon as their
// last gradient of the last micro-batch arrives, overlapping with the rest of backward. Linear
// layers attached to it (parallel::attach_main_grads) write their weight gradients in directly.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/comm/process_group.h"
#include "engine/parallel/main_grad.h"

namespace c10::cuda {
class CUDAStream;
}

namespace me::train {

class GradBuffer : public parallel::MainGradSink {
 public:
  // `dp` may be null (no data parallelism). With `shard_reduce` (distributed optimizer) the
  // buffer is reduce-scattered at finish() instead: each rank then holds the averaged grads
  // of its shard only. The flat size is padded to a multiple of the dp size.
  GradBuffer(const std::vector<torch::Tensor>& params, comm::ProcessGroup* dp, double bucket_mb, bool shard_reduce);
  ~GradBuffer() override;

  // Starts a step. No zeroing pass: each parameter's first gradient of the step is copied in
  // (later micro-batches add), and finish() zeroes the main grads of parameters that got none.
  void begin_step();
  // Arms the hooks for one micro-batch; on the last one, full buckets start their reduction.
  void begin_micro_batch(bool last);
  // Waits for every reduction: after it the buffer (or this rank's shard) holds dp-averaged grads.
  void finish();

  const torch::Tensor& flat() const { return flat_; }
  torch::Tensor view(size_t i) const;  // param i's main grad, shaped like the param
  int64_t offset(size_t i) const { return offsets_[i]; }
  int64_t numel() const { return flat_.numel(); }
  int64_t shard_size() const { return flat_.numel() / dp_size_; }
  int64_t shard_start() const { return shard_size() * dp_rank_; }

  // parallel::MainGradSink
  torch::Tensor main_grad(const torch::Tensor& param, bool* accumulate) override;
  void mark_written(const torch::Tensor& param) override;

 private:
  void on_grad(size_t i, const torch::Tensor& g);
  void arrived(size_t i);  // param i's gradient of this micro-batch is in the buffer
  struct Bucket {
    int64_t start, length;
    int pending = 0, size = 0;  // params not yet seen this micro-batch / params in the bucket
    comm::WorkPtr work;
  };

  std::vector<torch::Tensor> params_;
  std::vector<int64_t> offsets_;
  std::vector<size_t> bucket_of_;
  std::vector<char> written_;  // param i's main grad holds this step's gradient
  std::unordered_map<const void*, size_t> index_;  // a parameter's TensorImpl -> its index
  std::vector<Bucket> buckets_;
  torch::Tensor flat_;
  comm::ProcessGroup* dp_;
  int dp_size_ = 1, dp_rank_ = 0;
  bool shard_reduce_, last_ = false;
  std::shared_ptr<bool> alive_;       // hooks outliving the buffer do nothing
  std::shared_ptr<c10::cuda::CUDAStream> comm_stream_;  // GPU: where bucket reductions run
};

}  // namespace me::train
