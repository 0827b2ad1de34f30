#include "engine/train/trainer.h"

#include <unistd.h>

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
#include "engine/checkpoint/metadata.h"
#include "engine/train/memory_report.h"
#include "engine/train/run_metrics.h"
#include "engine/train/step_profiler.h"

namespace me::train {
namespace {

torch::Device parse_device(const std::string& name) {
  if (name == "cpu") return torch::kCPU;
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    ME_CHECK(compat::cuda_available(), "device '", name,
             "' asked for, but this LibTorch build sees no CUDA GPU: use device=cpu");
    return torch::Device(name);
  }
  fail("unknown device '", name, "': expected cpu, cuda or cuda:N");
}

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

torch::ScalarType param_dtype(const std::string& precision) {
  return precision == "bf16" ? torch::kBFloat16 : precision == "fp16" ? torch::kHalf : torch::kFloat;
}

}  // namespace

// ---- phases ---------------------------------------------------------------------------

void PhaseTimer::start() {
  if (!on_) return;
  if (cuda_) compat::cuda_synchronize();
  last_ = now_ms();
}

void PhaseTimer::mark(Phase phase) {
  if (!on_) return;
  if (cuda_) compat::cuda_synchronize();
  const double now = now_ms();
  total_[phase] += now - last_;
  last_ = now;
}

PhaseTimes PhaseTimer::take(int64_t steps) {
  PhaseTimes mean;
  for (int i = 0; i < kPhaseCount; ++i) mean.ms[i] = total_.ms[i] / static_cast<double>(steps);
  total_ = {};
  return mean;
}

// ---- the log window -------------------------------------------------------------------

void LogWindow::add(const torch::Tensor& loss, bool skipped, double ms, double waited_ms) {
  losses_.push_back(loss);
  skipped_.push_back(skipped);
  ms_ += ms;
  waited_ms_ += waited_ms;
}

double LogWindow::close(std::vector<double>& all) {
  const auto values = torch::cat(losses_).to(torch::kCPU, torch::kDouble);
  double sum = 0;
  int64_t counted = 0;
  for (size_t k = 0; k < losses_.size(); ++k) {
    const double loss = values[static_cast<int64_t>(k)].item<double>();
    all.push_back(loss);
    if (!skipped_[k]) {
      sum += loss;
      ++counted;
    }
  }
  steps_closed_ = static_cast<int64_t>(losses_.size());
  ms_per_step_ = ms_ / static_cast<double>(losses_.size());
  closed_waited_ms_ = waited_ms_;
  losses_.clear();
  skipped_.clear();
  ms_ = waited_ms_ = 0;
  return counted ? sum / static_cast<double>(counted) : all.back();
}

// ---- construction, in named steps ------------------------------------------------------

Trainer::Trainer(RunSpec spec)
    : spec_(std::move(spec)),
      device_(parse_device(spec_.device)),
      phases_(spec_.train.profile_phases, device_.is_cuda()) {
  validate(spec_);
  if (spec_.precision == "fp16") scaler_ = std::make_unique<optim::LossScaler>();
  connect();
  check_output_dirs();
  plan_batches();
  find_checkpoint();
  open_data();
  build_model();
  build_optimizer();
  build_pipeline();
  resume();
  if (saver_) saver_->prepare(state_tensors());  // the first save's host buffers, allocated meanwhile
}

Trainer::~Trainer() = default;

// Several ranks (a launcher set RANK/WORLD_SIZE or Slurm did): a communicator and the tp, pp
// and dp groups; dp is what tp x pp leaves of the world.
void Trainer::connect() {
  const auto& par = spec_.parallel;
  const auto env = comm::read_launch_env();
  if (env.world == 1 && par.tp == 1 && par.pp == 1) return;
  comm::CommOptions o;
  o.backend = spec_.comm.backend;
  o.device = spec_.device;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(spec_.comm.timeout_s * 1000));
  o.heartbeat_s = spec_.comm.heartbeat_s;
  o.dead_after_s = spec_.comm.dead_after_s;
  o.nccl_cta_policy = spec_.comm.nccl_cta_policy;
  comm_ = std::make_unique<comm::Communicator>(env, o);
  if (comm_->cuda_device() >= 0)
    device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(comm_->cuda_device()));
  groups_ = std::make_unique<comm::ParallelGroups>(
      comm::make_parallel_groups(*comm_, static_cast<int>(par.tp), static_cast<int>(par.pp)));
  for (const auto& w : groups_->warnings) log::warn(w);
  if (comm_->rank() == 0) log::info(groups_->layout_table);
  plan_.dp = groups_->dp->size();
  plan_.dp_rank = groups_->dp->rank();
}

// global batch = micro batch x data-parallel size x accumulation steps
void Trainer::plan_batches() {
  const auto& b = spec_.batch;
  plan_.global = b.global > 0 ? b.global : b.micro * plan_.dp;
  ME_CHECK(plan_.global % (b.micro * plan_.dp) == 0, "batch.global (", plan_.global,
           ") is not divisible by batch.micro x data-parallel size (", b.micro, " x ", plan_.dp, " = ",
           b.micro * plan_.dp, "): choose a global batch that is a multiple of it");
  plan_.accumulation = plan_.global / (b.micro * plan_.dp);
  const auto& t = spec_.train;
  plan_.iters = t.samples > 0 ? (t.samples + plan_.global - 1) / plan_.global : t.iters;
  lr_schedule_ = spec_.schedule.resolve(spec_.optim.lr, plan_.iters, plan_.global);
}

void Trainer::open_data() {
  DataLayout layout;
  layout.global_batch = plan_.global;
  layout.micro = spec_.batch.micro;
  layout.dp = plan_.dp;
  layout.dp_rank = plan_.dp_rank;
  layout.accumulation = plan_.accumulation;
  layout.iters = plan_.iters;
  layout.consumed_samples = resume_consumed_;
  layout.pin_memory = device_.is_cuda();
  data_ = std::make_unique<TrainData>(spec_, comm_.get(), layout);
  ME_CHECK(spec_.model.vocab >= data_->vocab(), "model.vocab (", spec_.model.vocab, ") is smaller than the ",
           data_->vocab(), " ids of the data's tokenizer: set model.vocab = ", data_->vocab());
}

// This rank's pipeline stage and tensor-parallel slice of the model, its weights drawn at full
// size from the seed (the same model at every layout), in the training precision.
void Trainer::build_model() {
  const auto& par = spec_.parallel;
  stage_ = {0, static_cast<int>(par.pp), par.pp_first_layers, par.pp_last_layers};
  if (par.pp_split == "balanced" && par.pp > 1) {
    std::tie(stage_.first_layers, stage_.last_layers) =
        model::balanced_stage_split(spec_.model, static_cast<int>(par.pp), static_cast<int>(par.tp));
    stage_.stage_layers(spec_.model.layers);
  }
  if (groups_) stage_.index = groups_->pp->rank();
  parallel::TensorParallel tp;
  if (groups_) tp.group = groups_->tp.get();
  tp.sequence_parallel = par.sequence_parallel;
  tp.overlap_comm = par.tp_comm_overlap;
  tp.comm_sm_margin = static_cast<int>(par.tp_comm_sm_margin);
  if (groups_ && par.tp_symmetric_mb > 0) {
    auto* group = groups_->tp.get();
    const auto device = device_;
    tp_slots_ = std::make_unique<parallel::SymmetricSlots>(
        [group, device](int64_t bytes) {
          return group->empty_symmetric(bytes, torch::TensorOptions(torch::kByte).device(device));
        },
        static_cast<int64_t>(par.tp_symmetric_mb * 1048576));
    tp.slots = tp_slots_.get();
  }
  model_ = model::Transformer(spec_.model, tp, stage_, /*initialize=*/false);
  model_->reset_parameters(static_cast<uint64_t>(spec_.seed));
  model_->to(device_, param_dtype(spec_.precision));
  params_ = model_->parameters();
  flops_per_iteration_ = spec_.model.flops_per_token(static_cast<int>(par.tp)) * static_cast<double>(plan_.global) *
                         static_cast<double>(spec_.model.seq);
}

// fp32 master weights (sharded over dp with the distributed optimizer), the gradient buffer the
// linear layers write into, and the optimizer over both.
void Trainer::build_optimizer() {
  const auto& par = spec_.parallel;
  const int tp_rank = groups_ ? groups_->tp->rank() : 0;
  std::vector<optim::MasterParam> masters;
  const auto named = model_->named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& info = model_->shards().at(named[i].key());
    // A parameter replicated over TP counts once in the gradient norm: on TP rank 0; the tied
    // word embedding held by the first and last stages, on the first.
    const bool shared_embedding = model_->holds_shared_embedding() && named[i].key() == "embedding.weight";
    const bool counted = (info.dim >= 0 || tp_rank == 0) && !(shared_embedding && !stage_.first());
    masters.push_back({named[i].value(), named[i].value().dim() >= 2, counted});
    saves_param_.push_back(counted);  // the same copy a checkpoint saves
    if (info.sequence_parallel_grad) sequence_parallel_params_.push_back(i);
    if (shared_embedding) shared_embedding_param_ = static_cast<int64_t>(i);
  }
  comm::ProcessGroup* dp = groups_ ? groups_->dp.get() : nullptr;
  grads_ = std::make_unique<GradBuffer>(params_, dp, par.bucket_mb, par.distributed_optimizer,
                                        par.symmetric_buffers == "all",
                                        par.grad_reduce_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat);
  parallel::attach_main_grads(*model_, par.grad_accumulation_fusion ? grads_.get() : nullptr);
  // The tied embedding's gradient is summed over the stages holding it before its DP reduction.
  if (shared_embedding_param_ >= 0) grads_->defer(static_cast<size_t>(shared_embedding_param_));
  // The distributed optimizer all-gathers updated parameters in place: they move into one flat
  // buffer laid out like the gradients.
  torch::Tensor flat_params;
  if (par.distributed_optimizer && plan_.dp > 1) flat_params = grads_->adopt_params(par.symmetric_buffers != "none");
  const auto& o = spec_.optim;
  optim::OptimizerConfig config;
  config.kind = o.kind;
  config.adam = {o.betas[0], o.betas[1], o.eps, o.weight_decay};
  config.momentum = o.momentum;
  config.clip = o.clip;
  config.distributed = par.distributed_optimizer;
  config.overlap_param_gather = par.overlap_param_gather;
  optimizer_ = std::make_unique<optim::MasterOptimizer>(std::move(masters), grads_->flat(), grads_->layout(), config,
                                                        groups_ ? groups_->model_parallel.get() : nullptr, dp,
                                                        flat_params);
  if (flat_params.defined() && par.overlap_param_gather)
    model_->set_before_use([opt = optimizer_.get()](torch::nn::Module& part) {
      for (const auto& p : part.parameters()) opt->wait_for(p);
    });
}

// Weight gradients are held back only where a pipeline has bubbles to fill, and only those the
// linear layers write into the buffer (gradient-accumulation fusion).
void Trainer::build_pipeline() {
  const auto& par = spec_.parallel;
  pipeline_ = std::make_unique<PipelineSchedule>(*model_, groups_ ? groups_->pp.get() : nullptr,
                                                 par.pp > 1 ? par.pp_deferred_wgrads : 0,
                                                 par.grad_accumulation_fusion ? grads_.get() : nullptr);
}

// ---- one step ----------------------------------------------------------------------------

bool Trainer::is_logging_rank() const { return !comm_ || comm_->rank() == 0; }

double Trainer::step_lr() const { return lr_schedule_.lr(spec_.schedule.in_samples() ? consumed_samples() : iteration_); }

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
    throw Error(oom_report(spec_, comm_ ? comm_->world_size() : 1, comm_ ? comm_->rank() : 0, 0, e.what()));
  }
}

StepResult Trainer::run_step() {
  const double t0 = now_ms();
  test_slow_rank();
  phases_.start();
  model_->train();
  auto batch = data_->next_train();
  // Pinned on a GPU: the copies overlap with the work already queued.
  auto tokens = batch.tokens.to(device_, /*non_blocking=*/true);
  auto labels = batch.labels.to(device_, /*non_blocking=*/true);
  phases_.mark(Phase::data);

  grads_->begin_step(plan_.accumulation);
  PipelineSchedule::Hooks hooks;
  hooks.after_backward = [&] {
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();  // the buffer holds the gradient
  };
  hooks.mark = [&](Phase phase) { phases_.mark(phase); };
  auto loss_sum = pipeline_->train(tokens, labels, spec_.batch.micro, plan_.accumulation,
                                   scaler_ ? scaler_->scale() : 1.0, hooks);
  // Gradients of replicated parameters that each rank saw only part of are summed. With tied
  // embeddings over pipeline stages the word embedding's (lookup on the first stage, output
  // layer on the last): before its DP reduction, since the stages lay their buffers out
  // differently. Under sequence parallelism the norms' (each TP rank saw its slice of
  // positions): after it, only the pieces this rank reduced (TP ranks share a layout).
  grads_->finish([&] {
    if (shared_embedding_param_ < 0) return;
    auto g = grads_->view(static_cast<size_t>(shared_embedding_param_));
    groups_->embedding->all_reduce(g, comm::ReduceOp::sum);
  });
  for (size_t i : sequence_parallel_params_)
    for (auto& piece : grads_->reduced_views(i)) groups_->tp->all_reduce(piece, comm::ReduceOp::sum);
  if (groups_ && plan_.dp > 1) groups_->dp->all_reduce(loss_sum, comm::ReduceOp::avg);
  if (scaler_) grads_->flat().div_(scaler_->scale());  // unscale before the norm and the update
  test_inject_nan();
  phases_.mark(Phase::reduce);

  StepResult r;
  r.iteration = ++iteration_;
  r.lr = step_lr();
  start_control();  // read after the norm, which waits for the GPU anyway
  r.grad_norm = optimizer_->step(r.lr);
  read_control();
  // A NaN/Inf gradient would poison the weights and every later step: skipped and counted.
  r.skipped = !std::isfinite(r.grad_norm);
  if (scaler_) scaler_->update(r.skipped);  // fp16 overflows are expected now and then: no warning
  if (r.skipped) {
    ++skipped_;
    if (std::isnan(r.grad_norm)) ++nan_;
    if (!scaler_) after_non_finite(r.grad_norm);
  } else {
    consecutive_nan_ = 0;
  }
  phases_.mark(Phase::optimizer);
  last_loss_ = loss_sum;
  r.loss = std::nan("");
  r.ms = now_ms() - t0;
  return r;
}

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

// ---- the run -------------------------------------------------------------------------------

namespace {

// "45s", "3m12s", "2h05m", "3d04h": a duration for people.
std::string duration_text(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char out[32];
  if (s < 60) std::snprintf(out, sizeof out, "%llds", static_cast<long long>(s));
  else if (s < 3600) std::snprintf(out, sizeof out, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else if (s < 86400) std::snprintf(out, sizeof out, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s % 3600 / 60));
  else std::snprintf(out, sizeof out, "%lldd%02lldh", static_cast<long long>(s / 86400), static_cast<long long>(s % 86400 / 3600));
  return out;
}

}  // namespace

// Megatron's progress line, then what it lacks: MFU, the loss scale, the time left (on a
// terminal beside the iteration, in a log file as a field of its own) and, with several
// ranks, each rank's own step time.
void Trainer::log_line(const LogRecord& r) const {
  static const bool terminal = isatty(STDOUT_FILENO) == 1;
  const std::string eta = r.eta_s >= 0 ? duration_text(r.eta_s) : "";
  char line[768];
  std::snprintf(line, sizeof line, " iteration %8lld/%8lld%s | consumed samples: %10lld | elapsed time per iteration (ms): %.1f | "
                "learning rate: %.3E | global batch size: %5lld | lm loss: %.6E | grad norm: %.3f | "
                "number of skipped iterations: %3lld | number of nan iterations: %3lld | tokens/s: %.0f | "
                "TFLOP/s/GPU: %.2f",
                static_cast<long long>(r.iteration), static_cast<long long>(r.iters),
                terminal && !eta.empty() ? (" (ETA " + eta + ")").c_str() : "", static_cast<long long>(r.consumed_samples),
                r.ms_per_iter, r.lr, static_cast<long long>(r.global_batch), r.loss, r.grad_norm,
                static_cast<long long>(r.skipped), static_cast<long long>(r.nan), r.tokens_per_s, r.tflops_per_gpu);
  std::string text = line;
  if (r.mfu > 0) {
    std::snprintf(line, sizeof line, " | MFU: %.1f%%", 100.0 * r.mfu);
    text += line;
  }
  if (r.loss_scale > 0) {
    std::snprintf(line, sizeof line, " | loss scale: %.1f", r.loss_scale);
    text += line;
  }
  if (!terminal && !eta.empty()) text += " | ETA: " + eta;
  if (r.slowest_rank >= 0) {
    std::snprintf(line, sizeof line, " | own step ms over ranks (min/median/max): %.1f/%.1f/%.1f (max: rank %d)",
                  r.rank_ms_min, r.rank_ms_median, r.rank_ms_max, r.slowest_rank);
    text += line;
  }
  log::info(text);
  if (r.phases.any()) {
    std::string phases = " phases (ms per iteration, synchronised):";
    for (int i = 0; i < kPhaseCount; ++i)
      phases += cat(i ? " |" : "", " ", kPhaseNames[i], " ", std::round(r.phases.ms[i] * 10) / 10);
    log::info(phases);
  }
  if (r.val_loss >= 0) {
    std::snprintf(line, sizeof line, " validation loss at iteration %lld | lm loss: %.6E | lm loss PPL: %.3f",
                  static_cast<long long>(r.iteration), r.val_loss, std::exp(r.val_loss));
    log::info(line);
  }
}

void Trainer::log_start() const {
  const auto& par = spec_.parallel;
  log::info("training ", spec_.name, ": ", spec_.model.describe(), ", ",
            spec_.model.parameter_count(static_cast<int>(par.tp)), " parameters (", model_->local_parameter_count(),
            " on this rank), ", spec_.precision, " on ", device_.str(), "; ", plan_.iters, " iterations of ",
            plan_.global, " samples (micro ", spec_.batch.micro, " x dp ", plan_.dp, " x accumulation ",
            plan_.accumulation, ")");
  log::info("data: ", data_->describe());
  if (const int pp = pipeline_->stages(); pp > 1) {
    std::string split;
    for (const int64_t n : stage_.stage_layers(spec_.model.layers)) split += (split.empty() ? "" : "/") + std::to_string(n);
    log::info("pipeline: ", pp, " stages of ", split, " layers (pp_split ", par.pp_split, "), 1F1B over ",
              plan_.accumulation, " micro-batches per step (its idle share (pp - 1) / (micro-batches + pp - 1) = ",
              std::round(1000.0 * (pp - 1) / static_cast<double>(plan_.accumulation + pp - 1)) / 10,
              "%), pp_deferred_wgrads ", par.pp_deferred_wgrads);
    if (plan_.accumulation < pp)
      log::warn("only ", plan_.accumulation, " micro-batches per step for ", pp,
                " pipeline stages: most of each step is idle; raise batch.global to at least ",
                pp * spec_.batch.micro * plan_.dp);
  }
  if (device_.is_cuda())
    log::info("fused CUDA kernels: ", kernels::describe(), "; attention: ", compat::attention_backend_name());
  if (par.distributed_optimizer)
    log::info("distributed optimizer: ", human::number(optimizer_->state_bytes() / 1048576.0), " MiB of fp32 masters and state on ",
              "this rank instead of ", human::number(optimizer_->unsharded_state_bytes() / 1048576.0), " MiB");
  if (par.grad_reduce_dtype == "bf16")
    log::info("gradients accumulated and reduced in bf16 (parallel.grad_reduce_dtype): ",
              human::number(grads_->flat().nbytes() / 1048576.0), " MiB buffer on this rank");
  if (grads_->symmetric_bytes() > 0 && comm_->backend() == "nccl")
    log::info("symmetric buffers (", par.symmetric_buffers, "): ", human::number(grads_->symmetric_bytes() / 1048576.0),
              " MiB registered with the data-parallel NCCL group, outside LibTorch's allocator (not in its peak)");
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
                     window.steps_closed());
  const bool eval_now =
      t.eval_iters > 0 && ((t.eval_interval > 0 && iteration_ % t.eval_interval == 0) || iteration_ == plan_.iters);
  if (eval_now) s.val_loss = rec.val_loss = evaluate();
  return rec;
}

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
      if (is_logging_rank()) log_line(rec);
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
