// The training loop. One step: this data-parallel rank's share of the global batch (TrainData)
// is cut into micro-batches; each runs forward and backward (through the pipeline stages in
// 1F1B order, see PipelineSchedule) into the fp32 gradient buffer, whose buckets are averaged
// over data parallelism as they fill; then the optimizer clips by the global norm, steps at
// the scheduled learning rate and writes the weights back. Tensor-parallel ranks and pipeline
// stages see the same batches.
#pragma once
#include <torch/torch.h>

#include <memory>

#include "engine/comm/communicator.h"
#include "engine/model/transformer.h"
#include "engine/optim/loss_scaler.h"
#include "engine/optim/master_optimizer.h"
#include "engine/parallel/symmetric_slots.h"
#include "engine/train/grad_buffer.h"
#include "engine/train/pipeline.h"
#include "engine/train/run_spec.h"
#include "engine/train/train_data.h"

namespace me::train {

struct StepResult {
  int64_t iteration = 0;
  double loss = 0, grad_norm = 0, lr = 0, ms = 0;
  bool skipped = false;  // non-finite gradient norm: update not applied
};

struct Summary {
  int64_t iterations = 0;
  double first_loss = 0, last_loss = 0, val_loss = -1;
  double tokens_per_s = 0;
  int64_t skipped = 0;
  std::string sample;  // decoded text sampled at the end, if asked for
  std::vector<double> losses;  // every step's loss (global-batch mean)
};

class Trainer {
 public:
  explicit Trainer(RunSpec spec);
  ~Trainer();

  StepResult step();  // one step, its loss read back
  // One step without reading the loss (r.loss is NaN): the host does not wait for the GPU
  // beyond the gradient norm, so the next step's work is queued while this one finishes.
  // last_loss() is the step's loss, still on the device.
  StepResult step_async();
  const torch::Tensor& last_loss() const { return last_loss_; }
  double evaluate();  // mean validation loss over train.eval_iters fixed batches
  Summary run();      // steps until the end, logging and evaluating on the way
  std::string sample(const std::string& prompt, int64_t tokens, int64_t top_k, double temperature);

  model::Transformer& model() { return model_; }
  const RunSpec& spec() const { return spec_; }
  int64_t iteration() const { return iteration_; }
  int64_t consumed_samples() const { return data_->consumed_samples(); }
  TrainData& data() { return *data_; }
  int64_t iters() const { return iters_; }
  int64_t global_batch() const { return global_batch_; }
  void set_on_log(std::function<void(const LogRecord&)> hook) { spec_.on_log = std::move(hook); }

 private:
  void log_line(const LogRecord& r) const;
  bool is_logging_rank() const;

  RunSpec spec_;
  torch::Device device_;
  std::unique_ptr<comm::Communicator> comm_;
  std::unique_ptr<comm::ParallelGroups> groups_;
  std::unique_ptr<TrainData> data_;
  std::unique_ptr<parallel::SymmetricSlots> tp_slots_;  // parallel.tp_symmetric_mb > 0
  model::Transformer model_{nullptr};
  std::unique_ptr<GradBuffer> grads_;
  std::unique_ptr<optim::MasterOptimizer> optimizer_;
  std::unique_ptr<optim::LossScaler> scaler_;  // fp16 only
  std::unique_ptr<PipelineSchedule> pipeline_;
  std::vector<torch::Tensor> params_;
  std::vector<size_t> sequence_parallel_params_;
  int64_t shared_embedding_param_ = -1;  // index of the tied word embedding shared by pipeline stages
  int64_t dp_ = 1, dp_rank_ = 0, accumulation_ = 1, global_batch_ = 0, iters_ = 0;
  int64_t iteration_ = 0, skipped_ = 0, nan_ = 0;
  double flops_per_iteration_ = 0;
  torch::Tensor last_loss_;
  // train.profile_phases: ms spent in each phase (LogRecord::kPhaseNames) since the last log;
  // "reduce" is what backward left of the gradient reduction.
  double phase_ms_[5] = {0, 0, 0, 0, 0};
  double phase_mark_ = 0;
  void mark_phase(int phase);
};

}  // namespace me::train
