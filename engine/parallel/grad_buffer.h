// Data-parallel gradients: one flat "main grad" buffer over this rank's parameters, fp32 (so
// micro-batches accumulate in fp32 whatever the parameter dtype) or bf16 (half the memory and
// half the bytes to reduce: Megatron's --grad-reduce-in-bf16), filled by a hook per parameter,
// split into buckets that are averaged over the data-parallel group as soon as the step's last
// gradient of each of their parameters arrives, overlapping with the rest of backward. Linear
// layers attached to it (parallel::attach_main_grads) write their weight gradients in directly.
// Under the distributed optimizer the buckets are reduce-scattered instead, each as soon as it
// is complete: every rank keeps the averaged gradients of its piece of each bucket.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/comm/process_group.h"
#include "engine/core/side_stream.h"
#include "engine/parallel/flat_layout.h"
#include "engine/parallel/main_grad.h"

namespace me::parallel {

class GradBuffer : public parallel::MainGradSink {
 public:
  // `dp` may be null (no data parallelism). With `shard_reduce` (distributed optimizer) each
  // bucket is padded to a multiple of the dp size and reduce-scattered instead of all-reduced:
  // afterwards each rank holds the averaged grads of its piece of every bucket (layout().shard).
  // `symmetric`: the flat buffer comes from dp->empty_symmetric (registered with the group).
  // `dtype`: the buffer's, kFloat or kBFloat16 (bucket_mb counts bytes of it).
  GradBuffer(const std::vector<torch::Tensor>& params, comm::ProcessGroup* dp, double bucket_mb, bool shard_reduce,
             bool symmetric = false, torch::ScalarType dtype = torch::kFloat);
  ~GradBuffer() override;

  // Param i's bucket is reduced only in finish(), after its `before_deferred` callback: for a
  // gradient that must first be summed over another group (the tied embedding's over the
  // first and last pipeline stages).
  void defer(size_t i);
  // Starts a step of `micro_batches` backward passes. No zeroing pass: each parameter's first
  // gradient of the step is copied in (later ones add), and finish() zeroes the main grads of
  // parameters that got none. A bucket starts its reduction once each of its parameters has
  // reported `micro_batches` gradients, in whatever order they come (a pipeline stage may hold
  // weight gradients back past the next micro-batch's backward).
  void begin_step(int64_t micro_batches);
  // Waits for every reduction: after it the buffer (or this rank's shard) holds dp-averaged
  // grads. `before_deferred` runs once the other buckets are reduced and before deferred ones.
  void finish(const std::function<void()>& before_deferred = {});

  // For CUDA graphs (train.cuda_graphs), whose replays cannot choose between writing a main grad
  // and adding to it: begin_step zeroes the buffer and every gradient adds (one memset a step).
  void set_zero_each_step(bool on) { zero_each_step_ = on; }
  // While a graph is captured nothing is computed: the hooks do nothing, and the parameters
  // whose main grads the captured work writes are logged instead of reported. The graph's owner
  // takes the log and reports them (mark_written) after each replay.
  std::vector<torch::Tensor> take_captured_writes();

  // The distributed optimizer's parameters: moves every parameter into one flat buffer of its
  // dtype laid out like the gradients (the parameters become views of it), so that the updated
  // pieces can be all-gathered bucket by bucket in place. Returns the buffer; `symmetric`: one
  // from dp->empty_symmetric, so that the all-gathers may run on the copy engines.
  torch::Tensor adopt_params(bool symmetric = false);

  // Bytes of this buffer's memory from dp->empty_symmetric (gradients and adopted parameters).
  int64_t symmetric_bytes() const { return symmetric_bytes_; }
  const torch::Tensor& flat() const { return flat_; }
  const parallel::FlatLayout& layout() const { return layout_; }
  torch::Tensor view(size_t i) const;  // param i's main grad, shaped like the param
  // The pieces of param i's main grad that hold reduced gradients on this rank: its whole view,
  // or under the distributed optimizer its parts inside this rank's shard (maybe none).
  std::vector<torch::Tensor> reduced_views(size_t i) const;
  int64_t offset(size_t i) const { return layout_.offsets[i]; }
  int64_t numel() const { return flat_.numel(); }

  // parallel::MainGradSink
  torch::Tensor main_grad(const torch::Tensor& param, bool* accumulate) override;
  void mark_written(const torch::Tensor& param) override;
  void mark_partly_written(const torch::Tensor& param) override;

 private:
  void on_grad(size_t i, const torch::Tensor& g);
  void arrived(size_t i);  // param i's gradient of this micro-batch is in the buffer
  void reduce(size_t b);    // starts bucket b's reduction (on the GPU on a side stream)
  struct Bucket {
    int64_t pending = 0, size = 0;  // gradients still to come this step / params in the bucket
    bool deferred = false;
    comm::WorkPtr work;
  };

  std::vector<torch::Tensor> params_;
  parallel::FlatLayout layout_;
  std::vector<size_t> bucket_of_;
  std::vector<char> written_;  // param i's main grad holds this step's gradient
  bool zero_each_step_ = false;
  std::vector<torch::Tensor> captured_writes_;
  std::unordered_map<const void*, size_t> index_;  // a parameter's TensorImpl -> its index
  std::vector<Bucket> buckets_;
  torch::Tensor flat_;
  comm::ProcessGroup* dp_;
  int dp_size_ = 1, dp_rank_ = 0;
  bool shard_reduce_;
  bool params_symmetric_ = false;  // the parameters live in the DP group's memory
  int64_t symmetric_bytes_ = 0;
  std::shared_ptr<bool> alive_;       // hooks outliving the buffer do nothing
  SideStream comm_stream_;            // GPU: where bucket reductions run
};

}  // namespace me::parallel
