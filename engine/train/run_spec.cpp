#include "engine/train/run_spec.h"

#include "engine/comm/communicator.h"
#include "engine/core/error.h"
#include "engine/model/transformer.h"

namespace me::train {

optim::LRSchedule ScheduleSpec::resolve(double max_lr, int64_t iters, int64_t global_batch) const {
  optim::LRSchedule s;
  s.kind = optim::LRSchedule::parse_kind(kind);
  s.max_lr = max_lr;
  s.min_lr = min_lr;
  const bool samples = in_samples();
  s.warmup = samples ? warmup_samples : warmup_iters;
  s.decay = samples ? decay_samples : decay_iters;
  s.wsd_decay = samples ? wsd_decay_samples : wsd_decay_iters;
  if (s.decay == 0) s.decay = samples ? iters * global_batch : iters;
  s.validate();
  return s;
}

namespace {

void validate_train(const RunSpec& s) {
  const auto& t = s.train;
  const auto& b = s.batch;
  ME_CHECK(t.iters > 0 || t.samples > 0, "train.iters (or train.samples) must be a positive integer, got ", t.iters);
  ME_CHECK(b.micro > 0, "batch.micro must be a positive integer, got ", b.micro);
  ME_CHECK(b.global >= 0, "batch.global must be >= 0 (0: micro x data-parallel size), got ", b.global);
  ME_CHECK(t.log_interval > 0, "train.log_interval must be a positive integer, got ", t.log_interval);
  ME_CHECK(t.eval_interval >= 0 && t.eval_iters >= 0, "train.eval_interval and train.eval_iters must be >= 0");
  ME_CHECK(s.precision == "fp32" || s.precision == "bf16" || s.precision == "fp16",
           "precision must be fp32, bf16 or fp16, got '", s.precision, "'");
  const auto& sp = s.sample;
  ME_CHECK(sp.tokens >= 0 && sp.top_k >= 1 && sp.temperature > 0,
           "sample: tokens must be >= 0, top_k >= 1 and temperature > 0");
  ME_CHECK(s.comm.timeout_s > 0 && s.comm.heartbeat_s > 0, "comm.timeout_s and comm.heartbeat_s must be positive");
  ME_CHECK(s.comm.dead_after_s >= 0, "comm.dead_after_s must be >= 0 seconds (0: off), got ", s.comm.dead_after_s);
  comm::check_nccl_cta_policy(s.comm.nccl_cta_policy);  // also without a communicator (one process)
  ME_CHECK(t.exit_interval >= 0, "train.exit_interval must be >= 0 (0: never), got ", t.exit_interval);
  ME_CHECK(t.nan_policy == "skip" || t.nan_policy == "stop", "train.nan_policy must be skip or stop, got '",
           t.nan_policy, "'");
  ME_CHECK(t.max_consecutive_nan >= 1, "train.max_consecutive_nan must be >= 1, got ", t.max_consecutive_nan);
  ME_CHECK(t.straggler_factor == 0 || t.straggler_factor > 1, "train.straggler_factor must be above 1 (or 0: off), got ",
           t.straggler_factor);
  const auto& c = s.checkpoint;
  ME_CHECK(c.interval >= 0, "checkpoint.interval must be >= 0 (0: only at the end), got ", c.interval);
  ME_CHECK(c.keep >= 0, "checkpoint.keep must be >= 0 (0: keep all), got ", c.keep);
  ME_CHECK(c.interval == 0 || !c.dir.empty(), "checkpoint.interval = ", c.interval,
           " saves nowhere: set checkpoint.dir (e.g. checkpoint.dir=/fsx/checkpoints/run)");
  ME_CHECK(c.iteration >= 0, "checkpoint.iteration must be >= 0 (0: the latest), got ", c.iteration);
  ME_CHECK(c.iteration == 0 || !c.dir.empty() || !c.load.empty(), "checkpoint.iteration = ", c.iteration,
           " resumes from nothing: set checkpoint.dir (or checkpoint.load)");
  ME_CHECK(!c.weights_only || !c.load.empty(), "checkpoint.weights_only takes the weights of checkpoint.load: set it");
}

void validate_parallel(const RunSpec& s) {
  const auto& par = s.parallel;
  ME_CHECK(par.tp >= 1 && par.pp >= 1, "parallel.tp and parallel.pp must be positive integers");
  ME_CHECK(par.bucket_mb > 0, "parallel.bucket_mb must be positive, got ", par.bucket_mb);
  ME_CHECK(par.pp_split == "even" || par.pp_split == "balanced",
           "parallel.pp_split must be \"even\" or \"balanced\", got '", par.pp_split, "'");
  if (par.pp_split == "balanced" && par.pp > 1)
    ME_CHECK(par.pp_first_layers == 0 && par.pp_last_layers == 0,
             "parallel.pp_split = \"balanced\" chooses the first and last stages' layers itself: leave ",
             "pp_first_layers and pp_last_layers at 0, or set pp_split = \"even\" to give them yourself");
  ME_CHECK(par.symmetric_buffers == "none" || par.symmetric_buffers == "params" || par.symmetric_buffers == "all",
           "parallel.symmetric_buffers must be none, params or all, got '", par.symmetric_buffers, "'");
  ME_CHECK(par.symmetric_buffers != "params" || par.distributed_optimizer,
           "parallel.symmetric_buffers = \"params\" is the distributed optimizer's parameter buffer: set ",
           "parallel.distributed_optimizer=true, or use \"all\" for the gradient buffer of plain data parallelism");
  ME_CHECK(par.grad_reduce_dtype == "fp32" || par.grad_reduce_dtype == "bf16",
           "parallel.grad_reduce_dtype must be fp32 or bf16, got '", par.grad_reduce_dtype, "'");
  ME_CHECK(par.grad_reduce_dtype == "fp32" || s.precision == "bf16",
           "parallel.grad_reduce_dtype = \"bf16\" keeps gradients in bf16, which needs bf16 training: set ",
           "precision = \"bf16\" (it is '", s.precision, "'), or grad_reduce_dtype = \"fp32\"");
  ME_CHECK(par.tp_symmetric_mb >= 0, "parallel.tp_symmetric_mb must be >= 0 (0: off), got ", par.tp_symmetric_mb);
  ME_CHECK(par.tp_symmetric_mb == 0 || (par.tp > 1 && par.sequence_parallel && par.tp_comm_overlap),
           "parallel.tp_symmetric_mb holds the overlapped sequence-parallel all-gathers: it needs parallel.tp > 1, ",
           "sequence_parallel = true and tp_comm_overlap = true (or set it to 0)");
  ME_CHECK(par.pp_deferred_wgrads >= 0, "parallel.pp_deferred_wgrads must be >= 0 (0: off), got ", par.pp_deferred_wgrads);
  ME_CHECK(par.tp_comm_sm_margin >= 0 && par.tp_comm_sm_margin < 1024,
           "parallel.tp_comm_sm_margin is a number of multiprocessors (0 or more, below the GPU's), got ",
           par.tp_comm_sm_margin);
  // The pipeline's layer split (every stage would find the same error). A balanced split is
  // chosen later, from the model.
  if (par.pp_split != "balanced")
    model::PipelineStage{0, static_cast<int>(par.pp), par.pp_first_layers, par.pp_last_layers}.stage_layers(
        s.model.layers);
}

}  // namespace

void validate(const RunSpec& spec) {
  validate_train(spec);
  validate_parallel(spec);
}

}  // namespace me::train
