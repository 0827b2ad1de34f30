// The training loop. One step: this data-parallel rank's share of the global batch (TrainData)
// is cut into micro-batches; each runs forward and backward (through the pipeline stages in
// 1F1B order, see PipelineSchedule) into the fp32 gradient buffer, whose buckets are averaged
// over data parallelism as they fill; then the optimizer clips by the global norm, steps at
// the scheduled learning rate and writes the weights back. Tensor-parallel ranks and pipeline
// stages see the same batches.
//
// A Trainer is built in named steps, in this order (trainer_build.cpp): the spec is validated; the
// ranks connect (communicator and parallel groups); the batch plan is made (global batch,
// accumulation, iterations); the data opens; the model is built on this rank's pipeline stage
// and tensor-parallel slice; the optimizer gets its master weights and gradient buffer; the
// pipeline schedule ties them together; a checkpoint to resume from (checkpoint.dir, else
// checkpoint.load) is found before the data opens and loaded last (trainer_checkpoint.cpp).
#pragma once
#include <torch/torch.h>

#include <memory>

#include "engine/checkpoint/dir_guard.h"
#include "engine/checkpoint/saver.h"
#include "engine/comm/communicator.h"
#include "engine/model/transformer.h"
#include "engine/optim/loss_scaler.h"
#include "engine/optim/master_optimizer.h"
#include "engine/parallel/symmetric_slots.h"
#include "engine/parallel/finalize_grads.h"
#include "engine/parallel/grad_buffer.h"
#include "engine/train/host_lead.h"
#include "engine/train/log_record.h"
#include "engine/train/progress_log.h"
#include "engine/train/pipeline.h"
#include "engine/config/recipe.h"
#include "engine/train/train_data.h"

namespace me::train {

struct StepResult {
  int64_t iteration = 0;
  double loss = 0, grad_norm = 0, lr = 0, ms = 0;
  bool skipped = false;  // non-finite gradient norm: update not applied
};

struct Summary {
  int64_t iterations = 0;
  double first_loss = 0, last_loss = 0;  // the first and the last step's loss
  double val_loss = -1;
  double tokens_per_s = 0;
  int64_t skipped = 0;
  std::string sample;  // decoded text sampled at the end, if asked for
  std::vector<double> losses;  // every step's loss (global-batch mean)
  // What the process should exit with: kExitOk, or kExitRequeue after a stop signal and a
  // save (engine/core/exit_status.h); `stopped`: why the run ended early ("" when it did not).
  int exit_status = 0;
  std::string stopped;
};

// How a step's samples split over the ranks and micro-batches (global = micro x dp x
// accumulation), and how many steps the run has.
struct BatchPlan {
  int64_t dp = 1, dp_rank = 0;
  int64_t global = 0, accumulation = 1, iters = 0;
};

class Trainer {
 public:
  explicit Trainer(config::Recipe spec);
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
  const config::Recipe& spec() const { return spec_; }
  int64_t iteration() const { return iteration_; }
  int64_t consumed_samples() const { return data_->consumed_samples(); }
  TrainData& data() { return *data_; }
  int64_t iters() const { return plan_.iters; }
  int64_t global_batch() const { return plan_.global; }
  void set_on_log(std::function<void(const LogRecord&)> hook) { spec_.hooks.on_log = std::move(hook); }

  // Checkpoints (trainer_checkpoint.cpp): a synchronous save into `dir` (every rank calls it),
  // and a load of a checkpoint directory or iter_N directory of any layout, after which the
  // run continues from its iteration and data position.
  void save(const std::string& dir);
  void load(const std::string& path);
  // This rank's pieces of the model, master weights and optimizer state (and rank 0's RNG
  // states), named as in the whole model; and what the checkpoint says besides them.
  std::vector<checkpoint::StateTensor> state_tensors() const;
  checkpoint::Metadata checkpoint_metadata() const;

 private:
  StepResult run_step();  // step_async's work; step_async turns CUDA's out-of-memory into a report
  std::pair<torch::Tensor, torch::Tensor> next_batch();  // tokens and labels on the device
  double loss_scale() const;                             // fp16's current scale, else 1
  PipelineSchedule::Hooks pipeline_hooks();
  // The constructor's steps, in order.
  void connect();
  void plan_batches();
  void check_output_dirs();
  void find_checkpoint();
  void open_data();
  void build_model();
  void build_optimizer();
  void build_pipeline();
  void resume();

  // Checkpoints at step boundaries (trainer_checkpoint.cpp).
  void load_state(checkpoint::CheckpointReader& reader);
  // Rank 0, before any rank looks: a lost tracker restored, checkpoint.iteration applied.
  void settle_checkpoint_dir(const checkpoint::CheckpointDir& dir);
  // The checkpoint to resume from against the recipe: another model refused (or, with
  // checkpoint.weights_only, warned), the checkpoint's schedule kept unless overridden.
  void check_resume(const checkpoint::Metadata& m, bool from_dir);
  void save_checkpoint();
  // What the run ends with after its last save: kExitError (and why) when the save of the
  // final iteration was attempted and did not commit.
  int final_save_status();
  // Commits, saves and stops as agreed; returns the exit status to stop with, or -1.
  int after_step(Summary& s);
  void finish_checkpoints();

  // Health (trainer_health.cpp): non-finite gradients, stragglers, time left, the stop control
  // (every rank's stop signal and save state, agreed at each step), test faults.
  void start_control();
  void read_control();
  bool accept_update(double grad_norm);  // the non-finite policy; false: the update was skipped
  int rank() const;
  void test_faults_before_step() const;
  void test_faults_after_backward();
  void report_non_finite(double norm);
  void after_non_finite(double norm);
  void measure_stragglers(LogRecord& rec, double window_ms, double window_waited_ms, int64_t steps, double host_wait_ms,
                          double barrier_ms = -1, HostLead::Window lead = {});
  double tp_barrier_ms_per_step(int64_t steps);  // < 0 without copy-engine collectives
  double eta_seconds(double ms_per_iter) const;

  void log_start() const;
  LogRecord close_window(LogWindow& window, const StepResult& r, Summary& s);
  void finish_run(Summary& s, double total_ms);
  bool is_logging_rank() const;
  double step_lr() const;

  config::Recipe spec_;
  torch::Device device_;
  std::unique_ptr<comm::Communicator> comm_;
  std::unique_ptr<comm::ParallelGroups> groups_;
  BatchPlan plan_;
  optim::LRSchedule lr_schedule_;
  model::PipelineStage stage_;
  std::unique_ptr<TrainData> data_;
  std::unique_ptr<parallel::SymmetricSlots> tp_slots_;  // parallel.tp_symmetric_mb > 0
  std::shared_ptr<kernels::PeerBuffers> tp_peers_;      // parallel.tp_comm_backend = "copy_engine"
  uint64_t tp_barrier_ns_ = 0;                          // tp_peers_' timed wait total at the last log
  uint64_t tp_barrier_count_ = 0;                       // and its count of timed barriers
  void open_tp_peers();
  checkpoint::StateTensor fp8_state() const;
  void load_fp8_state(checkpoint::CheckpointReader& reader, const checkpoint::StateTensor& t);
  std::unique_ptr<kernels::Fp8Model> fp8_;  // precision = "fp8": what the layers share (outlives model_)
  model::Transformer model_{nullptr};
  // train.cuda_graphs: the blocks as CUDA graphs, captured in this process's second step.
  std::shared_ptr<model::BlockGraphs> block_graphs_;
  int64_t steps_run_ = 0;  // run_step calls in this process (a resumed run starts at 0 too)
  void build_block_graphs();
  size_t gemm_trials_logged_ = 0;  // how many GEMM trials' choices the log has shown
  void log_gemm_trials();
  std::unique_ptr<parallel::GradBuffer> grads_;
  std::unique_ptr<optim::MasterOptimizer> optimizer_;
  std::unique_ptr<optim::LossScaler> scaler_;  // fp16 only
  std::unique_ptr<PipelineSchedule> pipeline_;
  std::vector<torch::Tensor> params_;
  parallel::SharedGradients shared_grads_;  // gradients summed beyond data parallelism (finalize_grads)
  int64_t iteration_ = 0, skipped_ = 0, nan_ = 0;
  double flops_per_iteration_ = 0;
  torch::Tensor last_loss_;
  PhaseTimer phases_;
  // How far the host runs ahead of its GPU (GPUs, several ranks: the progress line); one GPU
  // alone records nothing.
  std::unique_ptr<HostLead> host_lead_;
  std::unique_ptr<checkpoint::DirLock> dir_lock_;      // rank 0's lock on checkpoint.dir, held to the end
  std::unique_ptr<checkpoint::CheckpointSaver> saver_;  // checkpoint.dir set
  std::string resume_from_;        // the iteration directory to resume from; "" if none
  int64_t resume_consumed_ = 0;    // its consumed samples, where the data starts
  bool weights_only_ = false;      // resume_from_ is checkpoint.load taken as weights alone
  int64_t last_saved_ = -1;        // the iteration saved last
  struct Agreed {
    int stop_signal = 0;  // the largest stop signal any rank received (0: none)
    bool writing = false;  // some rank is still writing its part of a save
  } agreed_;
  torch::Tensor control_;  // start_control's all-reduce in flight
  int64_t consecutive_nan_ = 0;   // steps in a row with a non-finite gradient
  bool stop_non_finite_ = false;  // train.nan_policy = "stop" has seen enough of them
  std::string deterministic_settings_;  // train.deterministic: what was set, for the log
};

}  // namespace me::train
