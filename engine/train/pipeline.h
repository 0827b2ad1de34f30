// One training step's micro-batches through this rank's pipeline stage, in the 1F1B order of
// PipeDream-Flush (Narayanan et al. 2021; Megatron's non-interleaved schedule): stage s of S
// first runs S - s - 1 forwards ("warm-up"), then alternates one forward with one backward,
// then finishes the backwards ("cool-down"). At most S - s micro-batches' activations are
// alive at once, whatever the number of micro-batches. With one stage it is plain gradient
// accumulation: forward, backward, next micro-batch.
//
// Between stages travel the hidden states [micro, seq (/ tp with sequence parallelism),
// hidden] forward and their gradients backward, point to point over the pipeline group; a
// forward's send and a backward's receive (and vice versa) go as one send_recv batch so the
// neighbours cannot deadlock on their order.
#pragma once
#include <torch/torch.h>

#include <functional>

#include "engine/comm/process_group.h"
#include "engine/model/transformer.h"

namespace me::train {

class PipelineSchedule {
 public:
  // `pp` is null or of size 1 without pipeline parallelism.
  PipelineSchedule(model::TransformerImpl& model, comm::ProcessGroup* pp);

  // What the trainer does around the schedule: `before_backward(m, last)` arms the gradient
  // buffer for micro-batch m, `after_backward` drops the parameters' own grads, `mark(phase)`
  // times the phases (LogRecord::kPhaseNames indices; 3 is communication).
  struct Hooks {
    std::function<void(int64_t m, bool last)> before_backward;
    std::function<void()> after_backward;
    std::function<void(int phase)> mark;
  };

  // Forward and backward of `micro_batches` micro-batches of `micro` rows of tokens/labels
  // [micro_batches * micro, seq] (present on every stage: the first uses the tokens, the last
  // the labels). Each micro-batch's loss is divided by micro_batches and its backward scaled by
  // `loss_scale`. Returns the summed loss [1] (fp32) on every stage of the pipeline.
  torch::Tensor train(const torch::Tensor& tokens, const torch::Tensor& labels, int64_t micro, int64_t micro_batches,
                      double loss_scale, const Hooks& hooks);
  // Forward only (evaluation): the loss of one batch, on every stage.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& labels);
  // Forward only (sampling): the whole (padded) vocabulary's fp32 logits at the last position
  // of tokens [1, s], on every stage (model::generate's LastLogits).
  torch::Tensor last_logits(const torch::Tensor& tokens);

  int stages() const { return stages_; }

 private:
  // Sends `out` to stage `to` and receives `rows` micro-batch rows' activations (or their
  // gradients) from stage `from`, together; -1 (or an undefined `out`) skips that half.
  torch::Tensor transfer(const torch::Tensor& out, int to, int from, const torch::Tensor& tokens, int64_t rows);
  // Forward only, through every stage: the last stage's output (the logits' vocabulary slice),
  // undefined on the others (they pass their output on).
  torch::Tensor forward_only(const torch::Tensor& tokens);
  // The last stage's loss sum, shared with every stage (zeros elsewhere contribute nothing).
  torch::Tensor share_loss(torch::Tensor sum);

  model::TransformerImpl& model_;
  comm::ProcessGroup* pp_;
  int stages_ = 1, stage_ = 0;
  int64_t hidden_ = 0, seq_divisor_ = 1;  // activations travel as [rows, seq / seq_divisor_, hidden_]
  torch::TensorOptions options_;
};

}  // namespace me::train
