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
// neighbours cannot deadlock on their order. On the GPU the transfers run on a stream of their
// own: the compute stream waits only where it uses what arrives, never for a send.
//
// With `deferred_wgrads` = k > 0 (parallel.pp_deferred_wgrads), a backward computes only the
// input gradient the previous stage waits for; the linear layers' weight-gradient GEMMs are
// held back (parallel::WeightGradQueue) and run while the stage would otherwise wait: after
// each backward's send until k - 1 micro-batches' remain held, one more before each cool-down
// backward, the rest at the end. The zero-bubble idea (Qi et al. 2024, ZB-H1) within 1F1B's
// order and transfers. k = 1 holds nothing past the send (no memory beyond 1F1B's); each
// further micro-batch held keeps its linear layers' inputs and output gradients alive (GPT 1.3B:
// ~0.5 GB per layer at 4 x 2048 tokens), and lets the cool-down fill its wait.
#pragma once
#include <torch/torch.h>

#include <functional>

#include "engine/comm/process_group.h"
#include "engine/core/side_stream.h"
#include "engine/model/transformer.h"
#include "engine/parallel/main_grad.h"
#include "engine/train/log_record.h"

namespace me::train {

class PipelineSchedule {
 public:
  // `pp` is null or of size 1 without pipeline parallelism. `deferred_wgrads` > 0 holds weight
  // gradients back on their way into `sink` (where the model's linear layers write them; null:
  // none are held).
  PipelineSchedule(model::TransformerImpl& model, comm::ProcessGroup* pp, int64_t deferred_wgrads = 0,
                   parallel::MainGradSink* sink = nullptr);

  // What the trainer does around the schedule: `after_backward` drops the parameters' own
  // grads, `mark(phase)` times the phases (the waits for transfers count as Phase::reduce).
  struct Hooks {
    std::function<void()> after_backward;
    std::function<void(Phase phase)> mark;
    std::function<void(bool backward)> before_micro_batch;  // before each forward's and backward's work is queued
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
  class StepRun;  // one train() call's micro-batches in flight (pipeline.cpp)

  // A send_recv batch on its way; wait() returns what it receives (once that has arrived, for
  // the compute stream) and, with it, the end of its send.
  struct Transfer {
    torch::Tensor got;
    comm::WorkPtr work;
    torch::Tensor wait();
  };
  // Starts sending `out` to stage `to` and receiving `rows` micro-batch rows' activations (or
  // their gradients) from stage `from`, together; -1 (or an undefined `out`) skips that half.
  Transfer transfer(const torch::Tensor& out, int to, int from, const torch::Tensor& tokens, int64_t rows);
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
  int64_t deferred_wgrads_ = 0;
  parallel::MainGradSink* sink_ = nullptr;
  parallel::WeightGradQueue held_;
  SideStream transfers_;
};

}  // namespace me::train
