#include "engine/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include "engine/core/format.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/core/exit_status.h"
#include "engine/core/stop_signals.h"
#include "engine/core/torch_compat.h"
#include "engine/kernels/fused_ops.h"
#include "engine/model/block_graphs.h"
#include "engine/checkpoint/metadata.h"
#include "engine/plan/memory_report.h"
#include "engine/train/run_metrics.h"
#include "engine/train/step_profiler.h"

namespace me::train {

// ---- the run -------------------------------------------------------------------------------

Summary Trainer::run() {
  const auto& t = spec_.train;
  if (is_logging_rank()) log_start();
  std::unique_ptr<RunMetrics> metrics;  // log.dir: TensorBoard and metrics.jsonl, rank 0
  if (is_logging_rank() && !spec_.log.dir.empty()) {
    metrics = std::make_unique<RunMetrics>(spec_.log.dir, checkpoint::recipe_to_json(spec_));
    log::info("metrics: ", metrics->event_file(), " and ", spec_.log.dir, "/metrics.jsonl");
  }
  StopSignals signals;  // SIGTERM / SIGUSR1: save and stop at the next step boundary
  Summary s;
  LogWindow window;
  double total_ms = 0;
  std::unique_ptr<StepProfiler> profiler;
  if (t.profile_at > 0)
    profiler = std::make_unique<StepProfiler>(t.profile_at, t.profile_steps, t.profile_trace, device_.is_cuda(),
                                              comm_ ? comm_->rank() : 0);
  while (iteration_ < plan_.iters) {
    if (profiler) profiler->before_step(iteration_ + 1);
    const int64_t waited0 = comm::waited_ns();
    const auto r = step_async();
    const double waited_ms = static_cast<double>(comm::waited_ns() - waited0) / 1e6;
    if (profiler)
      if (const auto summary = profiler->after_step(iteration_, r.ms); !summary.empty() && is_logging_rank())
        log::info(summary);
    window.add(last_loss_, r.skipped, r.ms, waited_ms);
    total_ms += r.ms;
    const bool stopping = agreed_.stop_signal != 0 || stop_non_finite_ ||
                          (t.exit_interval > 0 && iteration_ % t.exit_interval == 0);
    if (iteration_ % t.log_interval == 0 || iteration_ == plan_.iters || stopping) {
      const auto rec = close_window(window, r, s);
      if (is_logging_rank()) log_progress_line(rec);
      if (metrics) metrics->write(rec, static_cast<double>(compat::cuda_memory().peak));
      if (spec_.hooks.on_log) spec_.hooks.on_log(rec);
    }
    if (const int status = after_step(s); status >= 0) {
      s.exit_status = status;
      break;
    }
  }
  if (s.stopped.empty()) {
    finish_checkpoints();
    s.exit_status = final_save_status();
  }
  finish_run(s, total_ms);
  return s;
}

LogRecord Trainer::close_window(LogWindow& window, const StepResult& r, Summary& s) {
  const auto& t = spec_.train;
  LogRecord rec;
  rec.loss = window.close(s.losses);
  rec.iteration = iteration_;
  rec.iters = plan_.iters;
  rec.consumed_samples = consumed_samples();
  rec.global_batch = plan_.global;
  rec.lr = r.lr;
  rec.grad_norm = r.grad_norm;
  rec.skipped = skipped_;
  rec.nan = nan_;
  rec.ms_per_iter = window.ms_per_step();
  rec.tokens_per_s = static_cast<double>(plan_.global * spec_.model.seq) * 1000.0 / rec.ms_per_iter;
  rec.tflops_per_gpu = flops_per_iteration_ / (rec.ms_per_iter / 1000.0) / (comm_ ? comm_->world_size() : 1) / 1e12;
  if (t.peak_tflops > 0) rec.mfu = rec.tflops_per_gpu / t.peak_tflops;
  if (scaler_) rec.loss_scale = scaler_->scale();
  rec.phases = phases_.take(window.steps_closed());
  rec.eta_s = eta_seconds(rec.ms_per_iter);
  measure_stragglers(rec, rec.ms_per_iter * static_cast<double>(window.steps_closed()), window.waited_ms(),
                     window.steps_closed(), optimizer_->take_norm_wait_ms(), tp_barrier_ms_per_step(window.steps_closed()),
                     host_lead_->take());
  const bool eval_now =
      t.eval_iters > 0 && ((t.eval_interval > 0 && iteration_ % t.eval_interval == 0) || iteration_ == plan_.iters);
  if (eval_now) s.val_loss = rec.val_loss = evaluate();
  return rec;
}

void Trainer::finish_run(Summary& s, double total_ms) {
  optimizer_->wait_params();  // the last update's all-gathers, if still in flight
  s.iterations = iteration_;
  s.skipped = skipped_;
  if (!s.losses.empty()) {
    s.first_loss = s.losses.front();
    s.last_loss = s.losses.back();
  }
  const double tokens_per_step = static_cast<double>(plan_.global * spec_.model.seq);
  s.tokens_per_s = total_ms > 0 ? tokens_per_step * static_cast<double>(s.losses.size()) * 1000.0 / total_ms : 0;
  if (const auto mem = compat::cuda_memory(); mem.peak > 0 && is_logging_rank())
    log::info("peak GPU memory on rank 0: ", mem.peak / 1048576, " MiB allocated by tensors; ", human::number(s.tokens_per_s),
              " tokens/s over the whole run");
  if (tp_slots_ && is_logging_rank())
    log::info("tensor-parallel symmetric slots (parallel.tp_symmetric_mb): ", human::number(tp_slots_->registered_bytes() / 1048576.0),
              " MiB registered, outside LibTorch's allocator; ", tp_slots_->fallbacks(),
              " all-gathers found no free slot and used ordinary memory");
  if (spec_.sample.tokens > 0 && s.stopped.empty()) {
    const auto& sp = spec_.sample;
    s.sample = sample(sp.prompt, sp.tokens, sp.top_k, sp.temperature);
    if (is_logging_rank()) log::info("sample (", sp.tokens, " tokens, top_k ", sp.top_k, "):\n", s.sample);
  }
}

// ---- one step ------------------------------------------------------------------------------

StepResult Trainer::step() {
  auto r = step_async();
  optimizer_->wait_params();  // a caller of the one-step API may read weights next
  r.loss = last_loss_.item<double>();
  return r;
}

StepResult Trainer::step_async() {
  try {
    return run_step();
  } catch (const c10::OutOfMemoryError& e) {
    // Instead of LibTorch's allocator dump: the memory estimate of this layout, its largest term
    // and the cheapest change (memory_report.h). The capacity is read from LibTorch's message.
    throw Error(plan::oom_report(spec_, comm_ ? comm_->world_size() : 1, comm_ ? comm_->rank() : 0, 0, e.what()));
  }
}

// One step, as Megatron's train_step: this rank's micro-batches through the pipeline into the
// gradient buffer, the gradients finalized (reduced over data parallelism, shared ones summed),
// then the optimizer and the non-finite policy. Nothing here waits for the GPU before the
// gradient norm.
StepResult Trainer::run_step() {
  if (block_graphs_ && steps_run_ == 1) {
    // The first step ran eagerly (plans, tables, workspaces made outside a capture); this one
    // captures. Its activations' cached memory goes back first: the graphs' pool takes its own.
    compat::cuda_synchronize();
    compat::cuda_empty_cache();
    block_graphs_->arm();
  }
  ++steps_run_;
  const double t0 = now_ms();
  test_faults_before_step();
  host_lead_->start_step();
  phases_.start();
  model_->train();
  auto [tokens, labels] = next_batch();
  grads_->begin_step(plan_.accumulation);
  auto loss = pipeline_->train(tokens, labels, spec_.batch.micro, plan_.accumulation, loss_scale(), pipeline_hooks());
  parallel::finalize_grads(*grads_, shared_grads_, loss_scale());
  if (groups_ && plan_.dp > 1) groups_->dp->all_reduce(loss, comm::ReduceOp::avg);
  test_faults_after_backward();
  phases_.mark(Phase::reduce);

  StepResult r;
  r.iteration = ++iteration_;
  r.lr = step_lr();
  start_control();  // read after the norm, which waits for the GPU anyway
  r.grad_norm = optimizer_->step(r.lr);
  if (fp8_) ++fp8_->weights_version;  // the layers' cached fp8 weights are stale now
  read_control();
  host_lead_->end_step();  // after the norm's read-back: every mark's work is done
  r.skipped = !accept_update(r.grad_norm);
  phases_.mark(Phase::optimizer);
  last_loss_ = loss;
  if (block_graphs_ && steps_run_ == 2 && is_logging_rank()) log::info("CUDA graphs (train.cuda_graphs): ", block_graphs_->describe());
  log_gemm_trials();
  r.loss = std::nan("");
  r.ms = now_ms() - t0;
  return r;
}

// ME_GEMM_AUTOTUNE=1: what the GEMMs' trials chose (kernels/gemm_trial.h), each time more of them
// have settled (they settle as the shapes' calls come: in the first few steps).
void Trainer::log_gemm_trials() {
  if (!is_logging_rank()) return;
  const size_t settled = kernels::gemm_autotune_settled();
  if (settled == gemm_trials_logged_) return;
  gemm_trials_logged_ = settled;
  log::info("cuBLASLt GEMM algorithms (ME_GEMM_AUTOTUNE=1) after step ", steps_run_, ": ", kernels::gemm_autotune_summary());
}

// The next global batch's share of this rank, on the device (pinned on a GPU: the copies overlap
// with the work already queued).
std::pair<torch::Tensor, torch::Tensor> Trainer::next_batch() {
  auto batch = data_->next_train();
  auto tokens = batch.tokens.to(device_, /*non_blocking=*/true);
  auto labels = batch.labels.to(device_, /*non_blocking=*/true);
  phases_.mark(Phase::data);
  return {tokens, labels};
}

double Trainer::loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }

PipelineSchedule::Hooks Trainer::pipeline_hooks() {
  PipelineSchedule::Hooks hooks;
  hooks.after_backward = [this] {
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();  // the buffer holds the gradient
  };
  hooks.mark = [this](Phase phase) { phases_.mark(phase); };
  hooks.before_micro_batch = [this](bool backward) { host_lead_->mark(backward); };
  return hooks;
}

bool Trainer::is_logging_rank() const { return !comm_ || comm_->rank() == 0; }

double Trainer::step_lr() const { return lr_schedule_.lr(spec_.schedule.in_samples() ? consumed_samples() : iteration_); }

// ---- evaluation and sampling ---------------------------------------------------------------

double Trainer::evaluate() {
  if (spec_.train.eval_iters == 0) return -1;
  torch::NoGradGuard no_grad;
  model_->eval();
  // The same validation batches every time (and on every rank), so evaluations compare.
  double sum = 0;
  for (int64_t i = 0; i < spec_.train.eval_iters; ++i) {
    auto batch = data_->valid_batch(i);
    sum += pipeline_->loss(batch.tokens.to(device_), batch.labels.to(device_)).item<double>();
  }
  model_->train();
  return sum / static_cast<double>(spec_.train.eval_iters);
}

std::string Trainer::sample(const std::string& prompt, int64_t tokens, int64_t top_k, double temperature) {
  auto ids = data_->encode(prompt.empty() ? std::string("\n") : prompt);
  // Through the pipeline (with one stage: the whole model), so every layout samples the same way.
  const bool was_training = model_->is_training();
  model_->eval();
  auto last_logits = [&](const torch::Tensor& input) { return pipeline_->last_logits(input); };
  auto out = model::generate(last_logits, spec_.model, device_, ids, tokens, top_k, temperature,
                             static_cast<uint64_t>(spec_.seed));
  if (was_training) model_->train();
  return data_->decode(out);
}

}  // namespace me::train
