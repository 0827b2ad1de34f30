#include "engine/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/core/torch_compat.h"
#include "engine/kernels/fused_ops.h"
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

}  // namespace

Trainer::Trainer(RunSpec spec) : spec_(std::move(spec)), device_(parse_device(spec_.device)) {
  auto& t = spec_.train;
  auto& par = spec_.parallel;
  ME_CHECK(t.iters > 0 || t.samples > 0, "train.iters (or train.samples) must be a positive integer, got ", t.iters);
  ME_CHECK(t.micro_batch > 0, "batch.micro must be a positive integer, got ", t.micro_batch);
  ME_CHECK(t.global_batch >= 0, "batch.global must be >= 0 (0: micro x data-parallel size), got ", t.global_batch);
  ME_CHECK(t.log_interval > 0, "train.log_interval must be a positive integer, got ", t.log_interval);
  ME_CHECK(t.eval_interval >= 0 && t.eval_iters >= 0, "train.eval_interval and train.eval_iters must be >= 0");
  ME_CHECK(spec_.precision == "fp32" || spec_.precision == "bf16" || spec_.precision == "fp16",
           "precision must be fp32, bf16 or fp16, got '", spec_.precision, "'");
  if (spec_.precision == "fp16") scaler_ = std::make_unique<optim::LossScaler>();
  ME_CHECK(par.tp >= 1 && par.pp >= 1, "parallel.tp and parallel.pp must be positive integers");
  ME_CHECK(par.bucket_mb > 0, "parallel.bucket_mb must be positive, got ", par.bucket_mb);
  ME_CHECK(par.pp_split == "even" || par.pp_split == "balanced",
           "parallel.pp_split must be \"even\" or \"balanced\", got '", par.pp_split, "'");
  if (par.pp_split == "balanced" && par.pp > 1) {
    ME_CHECK(par.pp_first_layers == 0 && par.pp_last_layers == 0,
             "parallel.pp_split = \"balanced\" chooses the first and last stages' layers itself: leave ",
             "pp_first_layers and pp_last_layers at 0, or set pp_split = \"even\" to give them yourself");
    std::tie(par.pp_first_layers, par.pp_last_layers) =
        model::balanced_stage_split(spec_.model, static_cast<int>(par.pp), static_cast<int>(par.tp));
  }
  // The pipeline's layer split, checked before anything is built (every stage would find the same error).
  model::PipelineStage{0, static_cast<int>(par.pp), par.pp_first_layers, par.pp_last_layers}.stage_layers(
      spec_.model.layers);
  ME_CHECK(par.symmetric_buffers == "none" || par.symmetric_buffers == "params" || par.symmetric_buffers == "all",
           "parallel.symmetric_buffers must be none, params or all, got '", par.symmetric_buffers, "'");
  ME_CHECK(par.symmetric_buffers != "params" || par.distributed_optimizer,
           "parallel.symmetric_buffers = \"params\" is the distributed optimizer's parameter buffer: set ",
           "parallel.distributed_optimizer=true, or use \"all\" for the gradient buffer of plain data parallelism");
  ME_CHECK(par.grad_reduce_dtype == "fp32" || par.grad_reduce_dtype == "bf16",
           "parallel.grad_reduce_dtype must be fp32 or bf16, got '", par.grad_reduce_dtype, "'");
  ME_CHECK(par.grad_reduce_dtype == "fp32" || spec_.precision == "bf16",
           "parallel.grad_reduce_dtype = \"bf16\" keeps gradients in bf16, which needs bf16 training: set ",
           "precision = \"bf16\" (it is '", spec_.precision, "'), or grad_reduce_dtype = \"fp32\"");
  ME_CHECK(par.tp_symmetric_mb >= 0, "parallel.tp_symmetric_mb must be >= 0 (0: off), got ", par.tp_symmetric_mb);
  ME_CHECK(par.tp_symmetric_mb == 0 || (par.tp > 1 && par.sequence_parallel && par.tp_comm_overlap),
           "parallel.tp_symmetric_mb holds the overlapped sequence-parallel all-gathers: it needs parallel.tp > 1, ",
           "sequence_parallel = true and tp_comm_overlap = true (or set it to 0)");
  ME_CHECK(par.pp_deferred_wgrads >= 0, "parallel.pp_deferred_wgrads must be >= 0 (0: off), got ", par.pp_deferred_wgrads);
  comm::check_nccl_cta_policy(spec_.comm.nccl_cta_policy);  // also without a communicator (one process)
  ME_CHECK(par.tp_comm_sm_margin >= 0 && par.tp_comm_sm_margin < 1024,
           "parallel.tp_comm_sm_margin is a number of multiprocessors (0 or more, below the GPU's), got ",
           par.tp_comm_sm_margin);

  // Several ranks (a launcher set RANK/WORLD_SIZE or Slurm did): communicate.
  const auto env = comm::read_launch_env();
  if (env.world > 1 || par.tp > 1 || par.pp > 1) {
    comm::CommOptions o;
    o.backend = spec_.comm.backend;
    o.device = spec_.device;
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(spec_.comm.timeout_s * 1000));
    o.heartbeat_s = spec_.comm.heartbeat_s;
    o.nccl_cta_policy = spec_.comm.nccl_cta_policy;
    comm_ = std::make_unique<comm::Communicator>(env, o);
    if (comm_->cuda_device() >= 0) device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(comm_->cuda_device()));
    groups_ = std::make_unique<comm::ParallelGroups>(
        comm::make_parallel_groups(*comm_, static_cast<int>(par.tp), static_cast<int>(par.pp)));
    for (const auto& w : groups_->warnings) log::warn(w);
    if (comm_->rank() == 0) log::info(groups_->layout_table);
    dp_ = groups_->dp->size();
    dp_rank_ = groups_->dp->rank();
  }
  // global batch = micro batch x data-parallel size x accumulation steps
  global_batch_ = t.global_batch > 0 ? t.global_batch : t.micro_batch * dp_;
  ME_CHECK(global_batch_ % (t.micro_batch * dp_) == 0, "batch.global (", global_batch_,
           ") is not divisible by batch.micro x data-parallel size (", t.micro_batch, " x ", dp_, " = ",
           t.micro_batch * dp_, "): choose a global batch that is a multiple of it");
  accumulation_ = global_batch_ / (t.micro_batch * dp_);
  iters_ = t.samples > 0 ? (t.samples + global_batch_ - 1) / global_batch_ : t.iters;

  DataLayout layout;
  layout.global_batch = global_batch_;
  layout.micro = t.micro_batch;
  layout.dp = dp_;
  layout.dp_rank = dp_rank_;
  layout.accumulation = accumulation_;
  layout.iters = iters_;
  layout.pin_memory = device_.is_cuda();
  data_ = std::make_unique<TrainData>(spec_, comm_.get(), layout);
  ME_CHECK(spec_.model.vocab >= data_->vocab(), "model.vocab (", spec_.model.vocab, ") is smaller than the ",
           data_->vocab(), " ids of the data's tokenizer: set model.vocab = ", data_->vocab());

  auto& sched = spec_.schedule.schedule;
  sched.max_lr = spec_.optim.lr;
  if (sched.decay == 0) sched.decay = spec_.schedule.in_samples ? iters_ * global_batch_ : iters_;
  sched.validate();

  parallel::TensorParallel tp;
  if (groups_) tp.group = groups_->tp.get();
  tp.sequence_parallel = par.sequence_parallel;
  tp.overlap_comm = par.tp_comm_overlap;
  tp.comm_sm_margin = static_cast<int>(par.tp_comm_sm_margin);
  if (groups_ && par.tp_symmetric_mb > 0) {
    auto* group = groups_->tp.get();
    const auto device = device_;
    tp_slots_ = std::make_unique<parallel::SymmetricSlots>(
        [group, device](int64_t bytes) { return group->empty_symmetric(bytes, torch::TensorOptions(torch::kByte).device(device)); },
        static_cast<int64_t>(par.tp_symmetric_mb * 1048576));
    tp.slots = tp_slots_.get();
  }
  model::PipelineStage stage;
  if (groups_) stage = {groups_->pp->rank(), groups_->pp->size(), par.pp_first_layers, par.pp_last_layers};
  model_ = model::Transformer(spec_.model, tp, stage, /*initialize=*/false);
  model_->reset_parameters(spec_.seed);
  model_->to(device_, spec_.precision == "bf16" ? torch::kBFloat16 : spec_.precision == "fp16" ? torch::kHalf : torch::kFloat);
  params_ = model_->parameters();

  std::vector<optim::MasterParam> masters;
  const auto named = model_->named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& info = model_->shards().at(named[i].key());
    // A parameter replicated over TP counts once in the gradient norm: on TP rank 0; the tied
    // word embedding held by the first and last stages, on the first.
    const bool shared_embedding = model_->holds_shared_embedding() && named[i].key() == "embedding.weight";
    const bool counted = (info.dim >= 0 || tp.rank() == 0) && !(shared_embedding && !stage.first());
    masters.push_back({named[i].value(), named[i].value().dim() >= 2, counted});
    if (info.sequence_parallel_grad) sequence_parallel_params_.push_back(i);
    if (shared_embedding) shared_embedding_param_ = static_cast<int64_t>(i);
  }
  grads_ = std::make_unique<GradBuffer>(params_, groups_ ? groups_->dp.get() : nullptr, par.bucket_mb,
                                        par.distributed_optimizer, par.symmetric_buffers == "all",
                                        par.grad_reduce_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat);
  parallel::attach_main_grads(*model_, par.grad_accumulation_fusion ? grads_.get() : nullptr);
  // The tied embedding's gradient is summed over the stages holding it before its DP reduction.
  if (shared_embedding_param_ >= 0) grads_->defer(static_cast<size_t>(shared_embedding_param_));
  // The distributed optimizer all-gathers updated parameters in place: they move into one flat
  // buffer laid out like the gradients.
  torch::Tensor flat_params;
  if (par.distributed_optimizer && dp_ > 1) flat_params = grads_->adopt_params(par.symmetric_buffers != "none");
  optim::OptimizerConfig ocfg;
  ocfg.kind = spec_.optim.kind;
  ocfg.adam = {spec_.optim.beta1, spec_.optim.beta2, spec_.optim.eps, spec_.optim.weight_decay};
  ocfg.momentum = spec_.optim.momentum;
  ocfg.clip = spec_.optim.clip;
  ocfg.distributed = par.distributed_optimizer;
  ocfg.overlap_param_gather = par.overlap_param_gather;
  optimizer_ = std::make_unique<optim::MasterOptimizer>(std::move(masters), grads_->flat(), grads_->layout(), ocfg,
                                                        groups_ ? groups_->model_parallel.get() : nullptr,
                                                        groups_ ? groups_->dp.get() : nullptr, flat_params);
  if (flat_params.defined() && par.overlap_param_gather)
    model_->set_before_use([opt = optimizer_.get()](torch::nn::Module& part) {
      for (const auto& p : part.parameters()) opt->wait_for(p);
    });
  // Weight gradients are held back only where a pipeline has bubbles to fill, and only those the
  // linear layers write into the buffer (gradient-accumulation fusion).
  pipeline_ = std::make_unique<PipelineSchedule>(*model_, groups_ ? groups_->pp.get() : nullptr,
                                                 par.pp > 1 ? par.pp_deferred_wgrads : 0,
                                                 par.grad_accumulation_fusion ? grads_.get() : nullptr);
  flops_per_iteration_ = spec_.model.flops_per_token(static_cast<int>(par.tp)) * static_cast<double>(global_batch_) *
                         static_cast<double>(spec_.model.seq);
}

Trainer::~Trainer() = default;

bool Trainer::is_logging_rank() const { return !comm_ || comm_->rank() == 0; }

void Trainer::mark_phase(int phase) {
  if (!spec_.train.profile_phases) return;
  if (device_.is_cuda()) compat::cuda_synchronize();
  const double now = now_ms();
  if (phase >= 0) phase_ms_[phase] += now - phase_mark_;
  phase_mark_ = now;
}

StepResult Trainer::step() {
  auto r = step_async();
  optimizer_->wait_params();  // a caller of the one-step API may read weights next
  r.loss = last_loss_.item<double>();
  return r;
}

StepResult Trainer::step_async() {
  const double t0 = now_ms();
  mark_phase(-1);
  model_->train();
  auto batch = data_->next_train();
  const int64_t micro = spec_.train.micro_batch;
  // Pinned on a GPU: the copies overlap with the work already queued.
  auto tokens = batch.tokens.to(device_, /*non_blocking=*/true);
  auto labels = batch.labels.to(device_, /*non_blocking=*/true);
  mark_phase(0);

  grads_->begin_step(accumulation_);
  PipelineSchedule::Hooks hooks;
  hooks.after_backward = [&] {
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();  // the buffer holds the gradient
  };
  hooks.mark = [&](int phase) { mark_phase(phase); };
  auto loss_sum = pipeline_->train(tokens, labels, micro, accumulation_, scaler_ ? scaler_->scale() : 1.0, hooks);
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
  if (groups_ && dp_ > 1) groups_->dp->all_reduce(loss_sum, comm::ReduceOp::avg);
  if (scaler_) grads_->flat().div_(scaler_->scale());  // unscale before the norm and the update
  mark_phase(3);

  StepResult r;
  r.iteration = ++iteration_;
  r.lr = spec_.schedule.schedule.lr(spec_.schedule.in_samples ? consumed_samples() : iteration_);
  r.grad_norm = optimizer_->step(r.lr);
  // A NaN/Inf gradient would poison the weights and every later step: skipped and counted.
  r.skipped = !std::isfinite(r.grad_norm);
  if (scaler_) scaler_->update(r.skipped);  // fp16 overflows are expected now and then: no warning
  if (r.skipped) {
    ++skipped_;
    if (std::isnan(r.grad_norm)) ++nan_;
    if (!scaler_) log::warn("iteration ", iteration_, ": gradient norm is ", r.grad_norm, ", update skipped");
  }
  mark_phase(4);
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

void Trainer::log_line(const LogRecord& r) const {
  char line[768];
  int n = std::snprintf(line, sizeof line,
                        " iteration %8lld/%8lld | consumed samples: %10lld | elapsed time per iteration (ms): %.1f | "
                        "learning rate: %.3E | global batch size: %5lld | lm loss: %.6E | grad norm: %.3f | "
                        "number of skipped iterations: %3lld | number of nan iterations: %3lld | tokens/s: %.0f | "
                        "TFLOP/s/GPU: %.2f",
                        static_cast<long long>(r.iteration), static_cast<long long>(r.iters),
                        static_cast<long long>(r.consumed_samples), r.ms_per_iter, r.lr,
                        static_cast<long long>(r.global_batch), r.loss, r.grad_norm, static_cast<long long>(r.skipped),
                        static_cast<long long>(r.nan), r.tokens_per_s, r.tflops_per_gpu);
  if (r.mfu > 0 && n > 0 && n < static_cast<int>(sizeof line))
    n += std::snprintf(line + n, sizeof line - static_cast<size_t>(n), " | MFU: %.1f%%", 100.0 * r.mfu);
  if (r.loss_scale > 0 && n > 0 && n < static_cast<int>(sizeof line))
    std::snprintf(line + n, sizeof line - static_cast<size_t>(n), " | loss scale: %.1f", r.loss_scale);
  log::info(line);
  if (r.phase_ms[1] > 0) {
    std::string phases = " phases (ms per iteration, synchronised):";
    for (int i = 0; i < 5; ++i) phases += cat(i ? " |" : "", " ", LogRecord::kPhaseNames[i], " ", std::round(r.phase_ms[i] * 10) / 10);
    log::info(phases);
  }
  if (r.val_loss >= 0) {
    std::snprintf(line, sizeof line, " validation loss at iteration %lld | lm loss: %.6E | lm loss PPL: %.3f",
                  static_cast<long long>(r.iteration), r.val_loss, std::exp(r.val_loss));
    log::info(line);
  }
}

Summary Trainer::run() {
  const auto& t = spec_.train;
  if (is_logging_rank()) {
    log::info("training ", spec_.name, ": ", spec_.model.describe(), ", ",
              spec_.model.parameter_count(static_cast<int>(spec_.parallel.tp)), " parameters (",
              model_->local_parameter_count(), " on this rank), ", spec_.precision, " on ", device_.str(), "; ",
              iters_, " iterations of ", global_batch_, " samples (micro ", t.micro_batch, " x dp ", dp_,
              " x accumulation ", accumulation_, ")");
    log::info("data: ", data_->describe());
    if (const int pp = pipeline_->stages(); pp > 1) {
      std::string split;
      for (const int64_t n : model_->stage().stage_layers(spec_.model.layers))
        split += (split.empty() ? "" : "/") + std::to_string(n);
      log::info("pipeline: ", pp, " stages of ", split, " layers (pp_split ", spec_.parallel.pp_split, "), 1F1B over ",
                accumulation_, " micro-batches per step (its idle share (pp - 1) / (micro-batches + pp - 1) = ",
                std::round(1000.0 * (pp - 1) / static_cast<double>(accumulation_ + pp - 1)) / 10,
                "%), pp_deferred_wgrads ", spec_.parallel.pp_deferred_wgrads);
      if (accumulation_ < pp)
        log::warn("only ", accumulation_, " micro-batches per step for ", pp,
                  " pipeline stages: most of each step is idle; raise batch.global to at least ",
                  pp * t.micro_batch * dp_);
    }
    if (device_.is_cuda())
      log::info("fused CUDA kernels: ", kernels::describe(), "; attention: ", compat::attention_backend_name());
    if (spec_.parallel.distributed_optimizer)
      log::info("distributed optimizer: ", optimizer_->state_bytes() / 1048576.0, " MiB of fp32 masters and state on ",
                "this rank instead of ", optimizer_->unsharded_state_bytes() / 1048576.0, " MiB");
    if (spec_.parallel.grad_reduce_dtype == "bf16")
      log::info("gradients accumulated and reduced in bf16 (parallel.grad_reduce_dtype): ",
                grads_->flat().nbytes() / 1048576.0, " MiB buffer on this rank");
    if (grads_->symmetric_bytes() > 0 && comm_->backend() == "nccl")
      log::info("symmetric buffers (", spec_.parallel.symmetric_buffers, "): ", grads_->symmetric_bytes() / 1048576.0,
                " MiB registered with the data-parallel NCCL group, outside LibTorch's allocator (not in its peak)");
  }
  Summary s;
  double window_loss = 0, window_ms = 0, total_ms = 0;
  int64_t window_n = 0;
  const double tokens_per_step = static_cast<double>(global_batch_ * spec_.model.seq);
  const int world = comm_ ? comm_->world_size() : 1;
  // The window's losses stay on the device until it is logged: reading each one would make the
  // host wait for every step's end before queueing the next.
  std::vector<torch::Tensor> window_losses;
  std::vector<bool> window_skipped;
  std::unique_ptr<StepProfiler> profiler;
  if (t.profile_at > 0)
    profiler = std::make_unique<StepProfiler>(t.profile_at, t.profile_steps, t.profile_trace, device_.is_cuda(),
                                              comm_ ? comm_->rank() : 0);
  while (iteration_ < iters_) {
    if (profiler) profiler->before_step(iteration_ + 1);
    const auto r = step_async();
    if (profiler)
      if (const auto summary = profiler->after_step(iteration_, r.ms); !summary.empty() && is_logging_rank())
        log::info(summary);
    window_losses.push_back(last_loss_);
    window_skipped.push_back(r.skipped);
    window_ms += r.ms;
    total_ms += r.ms;
    if (iteration_ % t.log_interval != 0 && iteration_ != iters_) continue;
    const auto losses = torch::cat(window_losses).to(torch::kCPU, torch::kDouble);
    for (size_t k = 0; k < window_losses.size(); ++k) {
      const double loss = losses[static_cast<int64_t>(k)].item<double>();
      s.losses.push_back(loss);
      s.last_loss = loss;
      if (!window_skipped[k]) {
        window_loss += loss;
        ++window_n;
      }
    }
    window_losses.clear();
    window_skipped.clear();
    LogRecord rec;
    rec.iteration = iteration_;
    rec.iters = iters_;
    rec.consumed_samples = consumed_samples();
    rec.global_batch = global_batch_;
    rec.lr = r.lr;
    rec.loss = window_n ? window_loss / static_cast<double>(window_n) : s.last_loss;
    rec.grad_norm = r.grad_norm;
    rec.skipped = skipped_;
    rec.nan = nan_;
    const int64_t steps_in_window = (iteration_ - 1) % t.log_interval + 1;
    rec.ms_per_iter = window_ms / static_cast<double>(steps_in_window);
    rec.tokens_per_s = tokens_per_step * 1000.0 / rec.ms_per_iter;
    rec.tflops_per_gpu = flops_per_iteration_ / (rec.ms_per_iter / 1000.0) / world / 1e12;
    if (t.peak_tflops > 0) rec.mfu = rec.tflops_per_gpu / t.peak_tflops;
    if (scaler_) rec.loss_scale = scaler_->scale();
    for (int i = 0; i < 5; ++i) {
      rec.phase_ms[i] = phase_ms_[i] / static_cast<double>(steps_in_window);
      phase_ms_[i] = 0;
    }
    const bool eval_now = t.eval_iters > 0 && ((t.eval_interval > 0 && iteration_ % t.eval_interval == 0) || iteration_ == iters_);
    if (eval_now) s.val_loss = rec.val_loss = evaluate();
    if (s.iterations == 0) s.first_loss = rec.loss;  // the first logged (window-mean) loss
    s.iterations = iteration_;
    s.last_loss = rec.loss;
    if (is_logging_rank()) log_line(rec);
    if (spec_.on_log) spec_.on_log(rec);
    window_loss = window_ms = 0;
    window_n = 0;
  }
  optimizer_->wait_params();  // the last update's all-gathers, if still in flight
  s.iterations = iteration_;
  s.skipped = skipped_;
  s.tokens_per_s = total_ms > 0 ? tokens_per_step * static_cast<double>(iteration_) * 1000.0 / total_ms : 0;
  if (const auto mem = compat::cuda_memory(); mem.peak > 0 && is_logging_rank())
    log::info("peak GPU memory on rank 0: ", mem.peak / 1048576, " MiB allocated by tensors; ", s.tokens_per_s,
              " tokens/s over the whole run");
  if (tp_slots_ && is_logging_rank())
    log::info("tensor-parallel symmetric slots (parallel.tp_symmetric_mb): ", tp_slots_->registered_bytes() / 1048576.0,
              " MiB registered, outside LibTorch's allocator; ", tp_slots_->fallbacks(),
              " all-gathers found no free slot and used ordinary memory");
  if (spec_.sample.tokens > 0) {
    s.sample = sample(spec_.sample.prompt, spec_.sample.tokens, spec_.sample.top_k, spec_.sample.temperature);
    if (is_logging_rank()) log::info("sample (", spec_.sample.tokens, " tokens, top_k ", spec_.sample.top_k, "):\n", s.sample);
  }
  return s;
}

std::string Trainer::sample(const std::string& prompt, int64_t tokens, int64_t top_k, double temperature) {
  auto ids = data_->encode(prompt.empty() ? std::string("\n") : prompt);
  // Through the pipeline (with one stage: the whole model), so every layout samples the same way.
  const bool was_training = model_->is_training();
  model_->eval();
  auto last_logits = [&](const torch::Tensor& input) { return pipeline_->last_logits(input); };
  auto out = model::generate(last_logits, spec_.model, device_, ids, tokens, top_k, temperature, spec_.seed);
  if (was_training) model_->train();
  return data_->decode(out);
}

}  // namespace me::train
