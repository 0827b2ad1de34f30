#include "engine/config/recipe.h"

#include <cstdlib>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/data/gpt_dataset.h"
#include "engine/model/pipeline_stage.h"

namespace me::config {

namespace {

// Runs f, putting `where` in front of the message of the me::Error it throws (a check shared
// with a place that does not know the field's name).
template <class F>
void naming(const std::string& where, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    throw Error(where + e.what());
  }
}

const char* unit_name(bool samples) { return samples ? "samples" : "iters"; }

}  // namespace

optim::LRSchedule ScheduleSpec::resolve(double max_lr, int64_t iters, int64_t global_batch) const {
  optim::LRSchedule s;
  s.kind = optim::LRSchedule::parse_kind(kind);
  s.max_lr = max_lr;
  s.min_lr = min_lr;
  const bool samples = in_samples();
  s.warmup = samples ? warmup_samples : warmup_iters;
  s.decay = samples ? decay_samples : decay_iters;
  s.wsd_decay = samples ? wsd_decay_samples : wsd_decay_iters;
  const bool whole_run = s.decay == 0;
  if (whole_run) s.decay = samples ? iters * global_batch : iters;
  // Named here, where the fields are known (LRSchedule::validate speaks of lengths only).
  const char* u = unit_name(samples);
  if (s.kind != optim::LRSchedule::Kind::constant && s.kind != optim::LRSchedule::Kind::inverse_sqrt)
    ME_CHECK(s.decay > s.warmup, "schedule.warmup_", u, " (", s.warmup, ") must be below the decay length, ", s.decay,
             whole_run ? cat(" (the whole run: train.", samples ? "samples" : "iters", ")") : cat(" (schedule.decay_", u, ")"),
             ": lower schedule.warmup_", u, " (e.g. schedule.warmup_", u, "=", s.decay / 10, ") or lengthen the ",
             whole_run ? "run" : "decay");
  s.validate();
  return s;
}

void ScheduleSpec::check() const {
  optim::LRSchedule::parse_kind(kind);
  const std::pair<const char*, int64_t> lengths[] = {
      {"warmup_iters", warmup_iters},     {"decay_iters", decay_iters},     {"wsd_decay_iters", wsd_decay_iters},
      {"warmup_samples", warmup_samples}, {"decay_samples", decay_samples}, {"wsd_decay_samples", wsd_decay_samples}};
  for (const auto& [name, v] : lengths) ME_CHECK(v >= 0, "schedule.", name, " must be >= 0, got ", v);
  ME_CHECK(min_lr >= 0, "schedule.min_lr must be >= 0, got ", min_lr);
}

void DataSpec::check() const {
  if (kind == "text") {
    ME_CHECK(holdout > 0 && holdout < 1, "data.holdout must be in (0, 1), got ", holdout);
    return;
  }
  ME_CHECK(kind == "gpt", "data.kind '", kind, "' is unknown: use me.data.text{} or me.data.gpt{}");
  naming("data.", [&] { data::split_documents(split, 1); });  // "data.split 'a,b,c': 'a' is not a number ..."
}

void BatchSpec::check() const {
  ME_CHECK(micro > 0, "batch.micro must be a positive integer, got ", micro);
  ME_CHECK(global >= 0, "batch.global must be >= 0 (0: micro x data-parallel size), got ", global);
}

void TrainSpec::check() const {
  ME_CHECK(iters > 0 || samples > 0, "train.iters (or train.samples) must be a positive integer, got ", iters);
  ME_CHECK(samples >= 0, "train.samples must be >= 0 (0: train.iters decides), got ", samples);
  ME_CHECK(log_interval > 0, "train.log_interval must be a positive integer, got ", log_interval);
  ME_CHECK(eval_interval >= 0 && eval_iters >= 0, "train.eval_interval and train.eval_iters must be >= 0");
  ME_CHECK(exit_interval >= 0, "train.exit_interval must be >= 0 (0: never), got ", exit_interval);
  ME_CHECK(nan_policy == "skip" || nan_policy == "stop", "train.nan_policy must be skip or stop, got '", nan_policy,
           "'");
  ME_CHECK(max_consecutive_nan >= 1, "train.max_consecutive_nan must be >= 1, got ", max_consecutive_nan);
  ME_CHECK(straggler_factor == 0 || straggler_factor > 1, "train.straggler_factor must be above 1 (or 0: off), got ",
           straggler_factor);
}

void CheckpointSpec::check() const {
  ME_CHECK(interval >= 0, "checkpoint.interval must be >= 0 (0: only at the end), got ", interval);
  ME_CHECK(keep >= 0, "checkpoint.keep must be >= 0 (0: keep all), got ", keep);
  ME_CHECK(interval == 0 || !dir.empty(), "checkpoint.interval = ", interval,
           " saves nowhere: set checkpoint.dir (e.g. checkpoint.dir=/fsx/checkpoints/run)");
  ME_CHECK(iteration >= 0, "checkpoint.iteration must be >= 0 (0: the latest), got ", iteration);
  ME_CHECK(iteration == 0 || !dir.empty() || !load.empty(), "checkpoint.iteration = ", iteration,
           " resumes from nothing: set checkpoint.dir (or checkpoint.load)");
  ME_CHECK(!weights_only || !load.empty(), "checkpoint.weights_only takes the weights of checkpoint.load: set it");
}

void SampleSpec::check() const {
  ME_CHECK(tokens >= 0 && top_k >= 1 && temperature > 0, "sample: tokens must be >= 0, top_k >= 1 and temperature > 0");
}

void LogSpec::check() const {
  naming("log.level: ", [&] { log::parse_level(level); });
}

void ParallelSpec::check() const {
  ME_CHECK(tp >= 1 && pp >= 1, "parallel.tp and parallel.pp must be positive integers");
  ME_CHECK(bucket_mb > 0, "parallel.bucket_mb must be positive, got ", bucket_mb);
  ME_CHECK(pp_split == "even" || pp_split == "balanced", "parallel.pp_split must be \"even\" or \"balanced\", got '",
           pp_split, "'");
  if (pp_split == "balanced" && pp > 1)
    ME_CHECK(pp_first_layers == 0 && pp_last_layers == 0,
             "parallel.pp_split = \"balanced\" chooses the first and last stages' layers itself: leave ",
             "pp_first_layers and pp_last_layers at 0, or set pp_split = \"even\" to give them yourself");
  ME_CHECK(symmetric_buffers == "none" || symmetric_buffers == "params" || symmetric_buffers == "all",
           "parallel.symmetric_buffers must be none, params or all, got '", symmetric_buffers, "'");
  ME_CHECK(symmetric_buffers != "params" || distributed_optimizer,
           "parallel.symmetric_buffers = \"params\" is the distributed optimizer's parameter buffer: set ",
           "parallel.distributed_optimizer=true, or use \"all\" for the gradient buffer of plain data parallelism");
  ME_CHECK(grad_reduce_dtype == "fp32" || grad_reduce_dtype == "bf16",
           "parallel.grad_reduce_dtype must be fp32 or bf16, got '", grad_reduce_dtype, "'");
  ME_CHECK(tp_symmetric_mb >= 0, "parallel.tp_symmetric_mb must be >= 0 (0: off), got ", tp_symmetric_mb);
  ME_CHECK(tp_symmetric_mb == 0 || overlapped_sequence_parallel(),
           "parallel.tp_symmetric_mb holds the overlapped sequence-parallel all-gathers: it needs parallel.tp > 1, ",
           "sequence_parallel = true and tp_comm_overlap = true (or set it to 0)");
  ME_CHECK(tp_comm_backend == "auto" || tp_comm_backend == "nccl" || tp_comm_backend == "copy_engine",
           "parallel.tp_comm_backend must be \"auto\", \"nccl\" or \"copy_engine\", got '", tp_comm_backend, "'");
  ME_CHECK(tp_comm_backend != "copy_engine" || overlapped_sequence_parallel(),
           "parallel.tp_comm_backend = \"copy_engine\" moves the overlapped sequence-parallel collectives: it needs ",
           "parallel.tp > 1, sequence_parallel = true and tp_comm_overlap = true (or leave it \"nccl\")");
  ME_CHECK(tp_comm_backend != "copy_engine" || tp_symmetric_mb == 0,
           "parallel.tp_comm_backend = \"copy_engine\" and parallel.tp_symmetric_mb (NCCL's windows) are two ways to ",
           "move the same collectives: use one");
  ME_CHECK(tp_gather == "ring" || tp_gather == "bulk",
           "parallel.tp_gather must be \"ring\" or \"bulk\", got '", tp_gather, "'");
  ME_CHECK(pp_deferred_wgrads >= 0, "parallel.pp_deferred_wgrads must be >= 0 (0: off), got ", pp_deferred_wgrads);
  ME_CHECK(tp_comm_sm_margin >= 0 && tp_comm_sm_margin < 1024,
           "parallel.tp_comm_sm_margin is a number of multiprocessors (0 or more, below the GPU's), got ",
           tp_comm_sm_margin);
}

namespace {

bool known_device(const std::string& d) {
  if (d == "cpu" || d == "cuda") return true;
  const std::string prefix = "cuda:";
  if (d.rfind(prefix, 0) != 0 || d.size() == prefix.size()) return false;
  return d.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
}

// train.cuda_graphs (model/block_graphs.h): the settings the graphs cannot hold, refused here so
// that a dry run refuses them too. Whether the copy engines open and the build has CUDA, the run
// finds out (Trainer::build_block_graphs).
void check_cuda_graphs(const Recipe& r) {
  if (!r.train.cuda_graphs) return;
  auto refuse_unless = [](bool ok, const std::string& why, const std::string& fix) {
    ME_CHECK(ok, cuda_graphs_refusal(why, fix));
  };
  const auto& par = r.parallel;
  refuse_unless(r.device.rfind("cuda", 0) == 0, cat("CUDA graphs need a GPU, and device = \"", r.device, "\""),
                "set device = \"cuda\"");
  refuse_unless(r.precision != "fp8", "fp8's scales are chosen on the host at every step", "use precision = \"bf16\"");
  refuse_unless(r.model.recompute != "full", "full recomputation runs a block's forward again inside its backward",
                "use model.recompute = \"selective\" or \"none\"");
  refuse_unless(par.pp == 1, cat("parallel.pp = ", par.pp, ": the graphs hold one micro-batch at a time, a pipeline stage several"),
                "use parallel.pp = 1");
  refuse_unless(par.tp == 1 || (par.sequence_parallel && par.tp_comm_overlap && par.tp_gather != "ring" &&
                                par.tp_comm_backend != "nccl"),
                cat("parallel.tp = ", par.tp, " needs the copy engines' sequence-parallel collectives inside the graphs ",
                    "(NCCL's are not captured)"),
                "set parallel.sequence_parallel = true, parallel.tp_comm_overlap = true, parallel.tp_gather = \"bulk\" "
                "and parallel.tp_comm_backend = \"copy_engine\" (GPUs of one node)");
}

}  // namespace

std::string cuda_graphs_refusal(const std::string& why, const std::string& fix) {
  return cat("train.cuda_graphs = true: ", why, "; ", fix, ", or set train.cuda_graphs = false");
}

bool fp8_emulated_for_tests() {
  const char* v = std::getenv("ME_TEST_FP8_EMULATED");
  return v && std::string(v) == "1";
}

void Recipe::check() const {
  // Whether a GPU is there is the run's to find out: a dry run may plan a cluster from a laptop.
  ME_CHECK(known_device(device), "unknown device '", device, "': expected cpu, cuda or cuda:N");
  // fp8: the transformer blocks' linear layers' GEMMs in fp8 on Hopper GPUs (kernels/fp8_linear.h).
  ME_CHECK(precision != "fp8" || device.rfind("cuda", 0) == 0 || fp8_emulated_for_tests(),
           "precision = \"fp8\" runs the linear layers' GEMMs in fp8 on Hopper GPUs (H100, H200); the CPU has no fp8 ",
           "GEMMs: use precision = \"bf16\" or \"fp32\" on the CPU");
  ME_CHECK(precision == "fp32" || precision == "bf16" || precision == "fp16" || precision == "fp8",
           "precision must be fp32, bf16, fp16 or fp8, got '", precision, "'");
  ME_CHECK(fp8_scaling == "delayed" || fp8_scaling == "current", "fp8_scaling must be \"delayed\" or \"current\", got '",
           fp8_scaling, "'");
  ME_CHECK(fp8_amax_history >= 1 && fp8_amax_history <= 1024, "fp8_amax_history must be between 1 and 1024 casts, got ",
           fp8_amax_history);
  ME_CHECK(fp8_margin >= 0 && fp8_margin <= 16, "fp8_margin must be between 0 and 16 (powers of two of headroom), got ",
           fp8_margin);
  data.check();
  optim.check();
  schedule.check();
  batch.check();
  parallel.check();
  comm.check();
  train.check();
  sample.check();
  checkpoint.check();
  log.check();
  ME_CHECK(parallel.tp_comm_backend != "copy_engine" || device.rfind("cuda", 0) == 0,
           "parallel.tp_comm_backend = \"copy_engine\" copies between GPUs: it needs device = \"cuda\" (it is '", device,
           "'), or leave it \"nccl\"");
  ME_CHECK(parallel.grad_reduce_dtype == "fp32" || bf16_weights(),
           "parallel.grad_reduce_dtype = \"bf16\" keeps gradients in bf16, which needs bf16 training: set ",
           "precision = \"bf16\" or \"fp8\" (it is '", precision, "'), or grad_reduce_dtype = \"fp32\"");
  check_cuda_graphs(*this);
  model.validate("model", static_cast<int>(parallel.tp), parallel.sequence_parallel);
  // The pipeline's layer split (every stage would find the same error). A balanced split is
  // chosen later, from the model.
  if (parallel.pp_split != "balanced")
    model::PipelineStage{0, static_cast<int>(parallel.pp), parallel.pp_first_layers, parallel.pp_last_layers}
        .stage_layers(model.layers);
}

void validate(const Recipe& spec) { spec.check(); }

StepPlan plan_steps(const Recipe& spec, int64_t dp) {
  const auto& b = spec.batch;
  StepPlan p;
  p.global = b.global > 0 ? b.global : b.micro * dp;
  ME_CHECK(p.global % (b.micro * dp) == 0, "batch.global (", p.global,
           ") is not divisible by batch.micro x data-parallel size (", b.micro, " x ", dp, " = ", b.micro * dp,
           "): choose a global batch that is a multiple of it");
  p.accumulation = p.global / (b.micro * dp);
  const auto& t = spec.train;
  p.from_samples = t.samples > 0;
  p.iters = p.from_samples ? (t.samples + p.global - 1) / p.global : t.iters;
  spec.schedule.resolve(spec.optim.lr, p.iters, p.global);  // checked with the run's length
  return p;
}

}  // namespace me::config
