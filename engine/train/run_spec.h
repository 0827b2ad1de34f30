// Everything a training run is made of, as plain data (config is data): the Lua bindings
// fill it from the recipe table, the trainer consumes it. No LibTorch here.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/data/tokenizer.h"
#include "engine/model/transformer_config.h"
#include "engine/optim/lr_schedule.h"

namespace me::train {

struct DataSpec {
  std::string kind = "text";  // text: a byte-level text file | gpt: Megatron .bin/.idx datasets
  // text
  std::string path;
  double holdout = 0.05;
  // gpt
  std::vector<std::pair<double, std::string>> blend;  // {weight, prefix}; one entry: one dataset
  std::string split = "969,30,1";
  std::string cache_dir;  // index caches; empty: next to the data
  bool eod_mask_loss = false;
  data::TokenizerSpec tokenizer;  // kind empty: none (samples cannot be decoded)
  // When set: a text or jsonl file that rank 0 preprocesses into the (single) prefix first if
  // its .bin/.idx are missing or older than it.
  std::string source, source_format = "text", json_key = "text";
};

struct OptimSpec {
  std::string kind = "adamw";  // adamw | sgd
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, clip = 1.0, momentum = 0.9;
};

struct ParallelSpec {
  int64_t tp = 1, pp = 1;  // dp is what is left of the world
  bool sequence_parallel = false;
  // Layers of the first and of the last pipeline stage (0: an even share). They hold the
  // embedding and the output layer, so they may take fewer layers than the others.
  int64_t pp_first_layers = 0, pp_last_layers = 0;
  // "even", or "balanced": the first and last stages' layers chosen so that every stage has
  // about the same model FLOPs, the output layer counted (model::balanced_stage_split).
  std::string pp_split = "even";
  // Micro-batches whose linear weight-gradient GEMMs a pipeline stage may hold back to run in
  // its idle time (train::PipelineSchedule; no effect without pipeline parallelism or without
  // grad_accumulation_fusion); 0: at once, in each backward (plain 1F1B); 1: each right after
  // its backward's send, no memory beyond 1F1B's; k: k - 1 more held, each costing memory.
  int64_t pp_deferred_wgrads = 1;
  bool distributed_optimizer = false;  // ZeRO-1: masters and optimizer state sharded over dp
  double bucket_mb = 25.0;             // gradient buckets reduced while backward goes on
  // Linear layers' weight-gradient GEMMs write straight into the main-grad buffer, in its dtype
  // (parallel/main_grad.h); false: bf16 gradients copied in by hooks (for A/B comparisons).
  bool grad_accumulation_fusion = true;
  // Tensor-parallel collectives overlapped with the GEMMs beside them (a side stream on the GPU;
  // parallel::linear, parallel/collective_matmul.h); false: in line.
  bool tp_comm_overlap = true;
  // Multiprocessors the GEMMs leave to a TP collective running beside them (0: none).
  int64_t tp_comm_sm_margin = 0;
  // Distributed optimizer: the updated parameters' all-gathers run on a side stream and the next
  // forward waits for each part's bucket just before using it (Megatron's --overlap-param-gather);
  // false: gathered in line before the step returns.
  bool overlap_param_gather = true;
  // Data-parallel buffers the DP group registers for direct access by every rank
  // (comm::ProcessGroup::empty_symmetric): "none", "params" (the distributed optimizer's flat
  // parameter buffer, which its all-gathers fill) or "all" (also the gradient buffer).
  std::string symmetric_buffers = "none";
  // The main-grad buffer's dtype, in which gradients accumulate over micro-batches and are
  // reduced over data parallelism: "fp32", or "bf16" (half the bytes: Megatron's
  // --grad-reduce-in-bf16; only with precision = "bf16").
  std::string grad_reduce_dtype = "fp32";
  // Up to this many MiB of activation buffers registered with the tensor-parallel group (NCCL
  // windows) for the overlapped sequence-parallel all-gathers to fill in place (NCCL's symmetric
  // kernels; the copy engines with comm.nccl_cta_policy = "zero"); 0: ordinary memory.
  double tp_symmetric_mb = 0;
};

struct CommSpec {
  std::string backend = "auto";
  double timeout_s = 600, heartbeat_s = 1.0;
  std::string nccl_cta_policy = "default";  // comm::CommOptions::nccl_cta_policy
};

struct TrainSpec {
  int64_t iters = 100;
  int64_t samples = 0;  // > 0: train this many samples (iters = samples / global batch, rounded up)
  int64_t micro_batch = 8;
  int64_t global_batch = 0;  // 0: micro batch x data-parallel size (no accumulation)
  int64_t log_interval = 10;
  int64_t eval_interval = 0;  // 0: evaluate only at the end
  int64_t eval_iters = 10;    // 0: no evaluation (benchmark mode)
  double peak_tflops = 0;     // the GPU's bf16 peak for MFU; 0: MFU not shown
  // Synchronise the GPU between the phases of a step and log where the time goes (slower:
  // the phases no longer overlap). For finding what to speed up, not for production runs.
  bool profile_phases = false;
  // A kernel-level profile (StepProfiler) of iterations profile_at .. profile_at + profile_steps
  // - 1, summarised in the log; profile_trace: where its Chrome trace goes ("": none).
  int64_t profile_at = 0, profile_steps = 3;
  std::string profile_trace;
};

struct SampleSpec {
  std::string prompt = "\n";
  int64_t tokens = 0;  // 0: no sample at the end
  int64_t top_k = 1;
  double temperature = 1.0;
};

// How the schedule counts: iterations, or samples as Megatron's --lr-warmup-samples etc.
struct ScheduleSpec {
  optim::LRSchedule schedule;  // warmup/decay in the unit below; decay 0 = the whole run
  bool in_samples = false;
};

// One progress line's numbers, handed to Lua hooks (`on_log`) as a table.
struct LogRecord {
  int64_t iteration = 0, iters = 0, consumed_samples = 0, global_batch = 0, skipped = 0, nan = 0;
  double lr = 0, loss = 0, grad_norm = 0, ms_per_iter = 0, tokens_per_s = 0, tflops_per_gpu = 0, mfu = 0;
  double val_loss = -1;  // < 0 when no evaluation ran at this iteration
  double loss_scale = 0;  // fp16 only
  // With train.profile_phases: mean ms per iteration of each phase over the log window.
  static constexpr const char* kPhaseNames[5] = {"data", "forward", "backward", "reduce", "optimizer"};
  double phase_ms[5] = {0, 0, 0, 0, 0};
};

struct RunSpec {
  std::string name = "run";
  std::string device = "cpu";
  // fp32 | bf16 | fp16: low-precision weights and activations with fp32 masters and grads;
  // fp16 adds dynamic loss scaling.
  std::string precision = "fp32";
  uint64_t seed = 1234;
  model::TransformerConfig model;
  DataSpec data;
  OptimSpec optim;
  ScheduleSpec schedule;
  ParallelSpec parallel;
  CommSpec comm;
  TrainSpec train;
  SampleSpec sample;
  std::function<void(const LogRecord&)> on_log;  // may throw me::Error to stop the run
};

}  // namespace me::train
