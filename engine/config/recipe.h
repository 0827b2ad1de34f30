// The recipe: everything a training run is made of, as plain data (config is data). The Lua
// bindings fill it from the recipe table, the trainer consumes it. No LibTorch here.
//
// Components own their options and the recipe composes them: the model's TransformerConfig,
// comm::CommOptions and optim::OptimizerOptions are declared, with visit_fields(), beside the
// code that uses them. The sections declared here (data, schedule, batch, parallel, train,
// checkpoint, sample, log) belong to the trainer. Defaults and help live in
// bindings/lua/fields.lua, whose constructors fill each field before the binding reads it
// (bindings/lua/lua_recipe.cpp); a component's C++ defaults must equal them
// (tests/unit/test_recipe_fields.cpp). visit_fields() names each field once, for that reader,
// for the checkpoint's copy of the resolved recipe and for the test that the two sides list the
// same fields. Adding a comm or optimizer field: its default and help in fields.lua, its member
// and its visit_fields() line in the component's header.
//
// Each section's check() throws me::Error naming the field and what it expects; Recipe::check()
// runs them all with the checks across sections. The run and `--dry-run` both call it, so a value
// the run would refuse is refused by the dry run too (never "fits").
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/comm/comm_options.h"
#include "engine/data/tokenizer.h"
#include "engine/model/transformer_config.h"
#include "engine/optim/lr_schedule.h"
#include "engine/optim/optimizer_options.h"

namespace me::train {
struct LogRecord;  // engine/train/log_record.h: what a progress line says
}

namespace me::config {

struct DataSpec {
  std::string kind;  // text: a byte-level text file | gpt: Megatron .bin/.idx datasets
  // text
  std::string path;
  double holdout{};
  // gpt
  std::vector<std::pair<double, std::string>> blend;  // {weight, prefix}; one entry: one dataset
  // data.blend was given (not data.prefix): even one entry is then Megatron's blend of one
  // (`--data-path 1.0 P`), whose dataset is built 0.5% larger, which can change its order.
  bool blend_given{};
  std::string split;
  std::string cache_dir;  // index caches; empty: next to the data
  bool eod_mask_loss{};
  data::TokenizerSpec tokenizer;  // kind empty: none (samples cannot be decoded)
  // When set: a text or jsonl file that rank 0 preprocesses into the (single) prefix first if
  // its .bin/.idx are missing or older than it.
  std::string source, source_format, json_key;

  void check() const;
};

// How the learning rate moves, in iterations or (any *_samples > 0) in samples, as Megatron's
// --lr-warmup-samples etc.
struct ScheduleSpec {
  std::string kind;
  int64_t warmup_iters{}, decay_iters{}, wsd_decay_iters{};
  int64_t warmup_samples{}, decay_samples{}, wsd_decay_samples{};
  double min_lr{};

  bool in_samples() const { return warmup_samples > 0 || decay_samples > 0 || wsd_decay_samples > 0; }
  // The schedule for a run of `iters` steps of `global_batch` samples peaking at `max_lr`
  // (decay 0: the whole run), checked.
  optim::LRSchedule resolve(double max_lr, int64_t iters, int64_t global_batch) const;
  void check() const;
};

struct BatchSpec {
  int64_t micro{};
  int64_t global{};  // 0: micro x data-parallel size (no accumulation)

  void check() const;
};

struct ParallelSpec {
  int64_t tp{}, pp{};  // dp is what is left of the world
  bool sequence_parallel{};
  // Layers of the first and of the last pipeline stage (0: an even share). They hold the
  // embedding and the output layer, so they may take fewer layers than the others.
  int64_t pp_first_layers{}, pp_last_layers{};
  // "even", or "balanced": the first and last stages' layers chosen so that every stage has
  // about the same model FLOPs, the output layer counted (model::balanced_stage_split).
  std::string pp_split;
  // Micro-batches whose linear weight-gradient GEMMs a pipeline stage may hold back to run in
  // its idle time (train::PipelineSchedule; no effect without pipeline parallelism or without
  // grad_accumulation_fusion); 0: at once, in each backward (plain 1F1B); 1: each right after
  // its backward's send, no memory beyond 1F1B's; k: k - 1 more held, each costing memory.
  // Fully recomputed layers never hold theirs back (their rebuilt activations would stay alive).
  int64_t pp_deferred_wgrads{};
  bool distributed_optimizer{};  // ZeRO-1: masters and optimizer state sharded over dp
  double bucket_mb{};            // gradient buckets reduced while backward goes on
  // Linear layers' weight-gradient GEMMs write straight into the main-grad buffer, in its dtype
  // (parallel/main_grad.h); false: bf16 gradients copied in by hooks (for A/B comparisons).
  bool grad_accumulation_fusion{};
  // Tensor-parallel collectives overlapped with the GEMMs beside them (a side stream on the GPU;
  // parallel::linear, parallel/collective_matmul.h); false: in line.
  bool tp_comm_overlap{};
  int64_t tp_comm_sm_margin{};  // multiprocessors the GEMMs leave to a TP collective beside them
  // Distributed optimizer: the updated parameters' all-gathers run on a side stream and the next
  // forward waits for each part's bucket just before using it (Megatron's --overlap-param-gather);
  // false: gathered in line before the step returns.
  bool overlap_param_gather{};
  // Data-parallel buffers the DP group registers for direct access by every rank
  // (comm::ProcessGroup::empty_symmetric): "none", "params" (the distributed optimizer's flat
  // parameter buffer, which its all-gathers fill) or "all" (also the gradient buffer).
  std::string symmetric_buffers;
  // The main-grad buffer's dtype, in which gradients accumulate over micro-batches and are
  // reduced over data parallelism: "fp32", or "bf16" (half the bytes: Megatron's
  // --grad-reduce-in-bf16; only with precision = "bf16").
  std::string grad_reduce_dtype;
  // Up to this many MiB of activation buffers registered with the tensor-parallel group (NCCL
  // windows) for the overlapped sequence-parallel all-gathers to fill in place (NCCL's symmetric
  // kernels; the copy engines with comm.nccl_cta_policy = "zero"); 0: ordinary memory.
  double tp_symmetric_mb{};
  // What moves the overlapped sequence-parallel all-gathers and reduce-scatters between the TP
  // ranks: "nccl" (its kernels, on a side stream), "copy_engine" (copies between the GPUs'
  // peer-mapped memories, which leave the GEMMs every multiprocessor; kernels/peer_buffers.h) or
  // "auto" (tp_backend(): the copy engines wherever they apply).
  std::string tp_comm_backend;
  // How NCCL's overlapped sequence-parallel all-gather meets its GEMM: "bulk" (one collective
  // beside the GEMM of this rank's rows, the rest after it) or "ring" (tp - 1 exchanges on the
  // side stream, each peer's rows multiplied as soon as they are in). The copy engines always
  // multiply each peer's rows as they land.
  std::string tp_gather;
  // Under sequence parallelism with tp_comm_overlap, a linear layer's backward holds its
  // weight-gradient GEMM until the next tensor-parallel collective of backward starts and runs it
  // beside that collective (parallel::DelayedWeightGrad; Transformer Engine's delayed wgrad): the
  // output gradient's all-gather then hides behind a whole GEMM and the input-gradient GEMM runs
  // unsplit. false: the all-gathers beside the input-gradient GEMM, split per rank's rows.
  bool tp_delay_wgrad{};
  // With tp_delay_wgrad on a GPU: the held weight-gradient GEMMs on a stream of their own
  // (DelayedWeightGrad::set_own_stream), so that backward's chain after each reduce-scatter runs
  // beside them. ME_TP_WGRAD_STREAM=m (multiprocessors left free) overrides it.
  bool tp_wgrad_stream{};
  // `parallel = "auto"`: tp, pp, sequence parallelism, recompute, the micro batch and the
  // distributed optimizer chosen by the layout planner for the job's GPUs at start
  // (engine/plan/layout_search.h; bindings/lua/megaengine.lua writes the choice into the
  // recipe before anything reads it).
  bool auto_layout{};

  void check() const;  // this section's own fields (Recipe::check: those tied to others)
  // tp_comm_backend resolved for a run on `device`: "auto" is "copy_engine" on CUDA where the
  // copy engines apply (tp > 1, sequence parallelism, tp_comm_overlap, no tp_symmetric_mb), else
  // "nccl". The trainer still falls back to NCCL under "auto" if the buffers cannot be mapped.
  // (Inline: the memory estimate asks it without linking the recipe's checks.)
  std::string tp_backend(const std::string& device) const {
    if (tp_comm_backend != "auto") return tp_comm_backend;
    const bool applies = overlapped_sequence_parallel() && tp_symmetric_mb == 0;
    return applies && device.rfind("cuda", 0) == 0 ? "copy_engine" : "nccl";
  }
  // What the copy engines and tp_symmetric_mb move: sequence-parallel collectives overlapped with
  // the GEMMs beside them.
  bool overlapped_sequence_parallel() const { return tp > 1 && sequence_parallel && tp_comm_overlap; }
};

struct TrainSpec {
  int64_t iters{};
  int64_t samples{};  // > 0: train this many samples (iters = samples / global batch, rounded up)
  int64_t log_interval{};
  int64_t eval_interval{};  // 0: evaluate only at the end
  int64_t eval_iters{};     // 0: no evaluation (benchmark mode)
  double peak_tflops{};     // the GPU's bf16 peak for MFU; 0: MFU not shown
  // Synchronise the GPU between the phases of a step and log where the time goes (slower:
  // the phases no longer overlap). For finding what to speed up, not for production runs.
  bool profile_phases{};
  // A kernel-level profile (StepProfiler) of iterations profile_at .. profile_at + profile_steps
  // - 1, summarised in the log; profile_trace: where its Chrome trace goes ("": none).
  int64_t profile_at{}, profile_steps{};
  std::string profile_trace;
  int64_t exit_interval{};  // stop at iterations divisible by it (saving first); 0: never
  std::string nan_policy;   // skip | stop (after max_consecutive_nan non-finite steps in a row)
  int64_t max_consecutive_nan{};
  double straggler_factor{};  // 0: no straggler report
  bool deterministic{};       // engine/core/determinism.h
  bool cuda_graphs{};         // the blocks as CUDA graphs from the second step (model/block_graphs.h)

  void check() const;
};

// Checkpoints (engine/checkpoint): Megatron's --save (dir), --save-interval, --load.
struct CheckpointSpec {
  std::string dir;        // "": no saving
  int64_t interval{};     // 0: only at the end, on a signal or at train.exit_interval
  int64_t keep{};         // 0: keep every committed checkpoint
  bool async{};
  std::string load;       // resume from here when dir holds no checkpoint
  bool save_on_exit{};
  bool weights_only{};       // load: its model weights alone (another model allowed), iteration 0
  bool override_schedule{};  // resume with the recipe's schedule instead of the checkpoint's
  int64_t iteration{};       // resume from this iteration instead of the latest; 0: the latest

  void check() const;
};

struct SampleSpec {
  std::string prompt;
  int64_t tokens{};  // 0: no sample at the end
  int64_t top_k{};
  double temperature{};

  void check() const;
};

struct LogSpec {
  std::string level;  // the log level; the bindings apply it (ME_LOG_LEVEL wins)
  std::string dir;    // "": no metrics files; else TensorBoard events + metrics.jsonl (train::RunMetrics)

  void check() const;
};

// Hooks a recipe may give; each may throw me::Error to stop the run.
struct RunHooks {
  std::function<void(const train::LogRecord&)> on_log;
};

struct Recipe {
  std::string name;
  std::string device;
  // fp32 | bf16 | fp16: low-precision weights and activations with fp32 masters and grads;
  // fp16 adds dynamic loss scaling; fp8: bf16, with the transformer blocks' linear layers' GEMMs
  // in fp8 (Hopper GPUs; kernels/fp8_linear.h).
  std::string precision;
  // precision = "fp8": the per-tensor scales, "delayed" (the largest amax of the last
  // fp8_amax_history casts) or "current" (each tensor's own amax, one more pass over it), and
  // 2^fp8_margin of headroom below the format's largest value.
  std::string fp8_scaling = "delayed";
  int64_t fp8_amax_history = 16;
  double fp8_margin = 0;
  // The weights and activations' dtype: bf16 for fp8 too (its GEMMs cast on the way in).
  bool bf16_weights() const { return precision == "bf16" || precision == "fp8"; }
  int64_t seed{};
  model::TransformerConfig model;
  DataSpec data;
  optim::OptimizerOptions optim;
  ScheduleSpec schedule;
  BatchSpec batch;
  ParallelSpec parallel;
  comm::CommOptions comm;
  TrainSpec train;
  SampleSpec sample;
  CheckpointSpec checkpoint;
  LogSpec log;
  RunHooks hooks;

  // Every check that needs only the recipe (not the world size or the data): each section's and
  // those across sections (precision, the model, the pipeline split).
  void check() const;
};

// ME_TEST_FP8_EMULATED=1, for tests only: precision = "fp8" on the CPU, its GEMMs emulated in
// float32 (kernels/fp8_linear.h), so that CI runs the layers' fp8 paths at every layout.
bool fp8_emulated_for_tests();

// What refuses train.cuda_graphs = true, in one form for the recipe's check and the run's:
// "train.cuda_graphs = true: <why>; <fix>, or set train.cuda_graphs = false".
std::string cuda_graphs_refusal(const std::string& why, const std::string& fix);

// Throws me::Error naming the field and what it expects, before anything is built: every
// check that needs only the recipe (not the world size or the data).
void validate(const Recipe& spec);

// The step plan of a run on `dp` data-parallel ranks: the global batch, the accumulation steps
// and the iterations (train.samples / global batch, rounded up, when samples are given), with
// the learning-rate schedule they make checked. The trainer and the dry run both use it.
struct StepPlan {
  int64_t global{}, accumulation{}, iters{};
  bool from_samples{};  // iters came from train.samples
};
StepPlan plan_steps(const Recipe& spec, int64_t dp);

// ---- every field by name, once ----------------------------------------------------------
// visit_fields(section, v) calls v("name", member) for each field of a recipe section, in
// fields.lua's order. Written once for const and non-const sections (Spec is either).
template <class Spec, class T>
using if_section = std::enable_if_t<std::is_same_v<std::remove_const_t<Spec>, T>, int>;

template <class S, class V, if_section<S, BatchSpec> = 0>
void visit_fields(S& b, V&& v) {
  v("micro", b.micro);
  v("global", b.global);
}

template <class S, class V, if_section<S, ParallelSpec> = 0>
void visit_fields(S& p, V&& v) {
  v("tp", p.tp);
  v("pp", p.pp);
  v("pp_first_layers", p.pp_first_layers);
  v("pp_last_layers", p.pp_last_layers);
  v("pp_split", p.pp_split);
  v("pp_deferred_wgrads", p.pp_deferred_wgrads);
  v("sequence_parallel", p.sequence_parallel);
  v("distributed_optimizer", p.distributed_optimizer);
  v("bucket_mb", p.bucket_mb);
  v("grad_accumulation_fusion", p.grad_accumulation_fusion);
  v("tp_comm_overlap", p.tp_comm_overlap);
  v("tp_comm_sm_margin", p.tp_comm_sm_margin);
  v("overlap_param_gather", p.overlap_param_gather);
  v("symmetric_buffers", p.symmetric_buffers);
  v("grad_reduce_dtype", p.grad_reduce_dtype);
  v("tp_symmetric_mb", p.tp_symmetric_mb);
  v("tp_comm_backend", p.tp_comm_backend);
  v("tp_gather", p.tp_gather);
  v("tp_delay_wgrad", p.tp_delay_wgrad);
  v("tp_wgrad_stream", p.tp_wgrad_stream);
  v("auto", p.auto_layout);
}

template <class S, class V, if_section<S, TrainSpec> = 0>
void visit_fields(S& t, V&& v) {
  v("iters", t.iters);
  v("samples", t.samples);
  v("log_interval", t.log_interval);
  v("eval_interval", t.eval_interval);
  v("eval_iters", t.eval_iters);
  v("peak_tflops", t.peak_tflops);
  v("profile_phases", t.profile_phases);
  v("profile_at", t.profile_at);
  v("profile_steps", t.profile_steps);
  v("profile_trace", t.profile_trace);
  v("exit_interval", t.exit_interval);
  v("nan_policy", t.nan_policy);
  v("max_consecutive_nan", t.max_consecutive_nan);
  v("straggler_factor", t.straggler_factor);
  v("deterministic", t.deterministic);
  v("cuda_graphs", t.cuda_graphs);
}

template <class S, class V, if_section<S, CheckpointSpec> = 0>
void visit_fields(S& c, V&& v) {
  v("dir", c.dir);
  v("interval", c.interval);
  v("keep", c.keep);
  v("async", c.async);
  v("load", c.load);
  v("save_on_exit", c.save_on_exit);
  v("weights_only", c.weights_only);
  v("override_schedule", c.override_schedule);
  v("iteration", c.iteration);
}

template <class S, class V, if_section<S, SampleSpec> = 0>
void visit_fields(S& s, V&& v) {
  v("prompt", s.prompt);
  v("tokens", s.tokens);
  v("top_k", s.top_k);
  v("temperature", s.temperature);
}

template <class S, class V, if_section<S, LogSpec> = 0>
void visit_fields(S& l, V&& v) {
  v("level", l.level);
  v("dir", l.dir);
}

template <class S, class V, if_section<S, ScheduleSpec> = 0>
void visit_fields(S& s, V&& v) {
  v("kind", s.kind);
  v("warmup_iters", s.warmup_iters);
  v("decay_iters", s.decay_iters);
  v("min_lr", s.min_lr);
  v("wsd_decay_iters", s.wsd_decay_iters);
  v("warmup_samples", s.warmup_samples);
  v("decay_samples", s.decay_samples);
  v("wsd_decay_samples", s.wsd_decay_samples);
}

// The top level's plain fields (the sections are visited on their own).
template <class S, class V, if_section<S, Recipe> = 0>
void visit_top_fields(S& r, V&& v) {
  v("name", r.name);
  v("device", r.device);
  v("seed", r.seed);
  v("precision", r.precision);
  v("fp8_scaling", r.fp8_scaling);
  v("fp8_amax_history", r.fp8_amax_history);
  v("fp8_margin", r.fp8_margin);
}

// Calls f("section", section) for each plain section of a Recipe (model and data, which have
// variants, are handled by their readers).
template <class S, class F, if_section<S, Recipe> = 0>
void visit_sections(S& r, F&& f) {
  f("optimizer", r.optim);
  f("schedule", r.schedule);
  f("batch", r.batch);
  f("parallel", r.parallel);
  f("comm", r.comm);
  f("train", r.train);
  f("sample", r.sample);
  f("checkpoint", r.checkpoint);
  f("log", r.log);
}

}  // namespace me::config
