// The memory reports a user reads: `megaengine --dry-run` (layout, parameter counts, the memory
// estimate per GPU and a verdict, from shapes alone: nothing allocated, no data opened) and the
// same breakdown when a run has hit CUDA's out-of-memory (oom_report). No LibTorch here.
#pragma once
#include <string>

#include "engine/plan/memory_advice.h"
#include "engine/config/recipe.h"

namespace me::plan {

struct DryRunOptions {
  int world = 1;           // GPUs of the run (--world)
  int gpus_per_node = 8;   // --gpus-per-node
  double gpu_bytes = 80e9; // --gpu-memory (80 GB: an H100 80GB less ~5.5 GB of headroom)
};

// The estimator's inputs for `spec` run on `world` GPUs.
plan::MemoryPlan memory_plan(const config::Recipe& spec, int world);

// Parameter counts: the model's and each pipeline stage's.
std::string parameter_report(const plan::MemoryPlan& plan);
// The estimate's table (first and last stage, and the busiest if it is another; each with and
// without the distributed optimizer) and the verdict: it fits, or the largest term and the
// cheapest change that fits, as recipe overrides.
std::string memory_report(const plan::MemoryPlan& plan, double gpu_bytes, int gpus_per_node);
// All of the dry run after the resolved recipe: layout, parameters, memory, verdict.
std::string dry_run_report(const config::Recipe& spec, const DryRunOptions& opts);

// For the trainer's catch of c10::OutOfMemoryError, instead of LibTorch's allocator dump: the
// estimate's breakdown for the running layout, its largest term and what to change. `what` is the
// error's what(): its first sentences are kept ("Tried to allocate 2.00 GiB. GPU 0 has a total
// capacity of 79.19 GiB ..."), and gpu_bytes <= 0 takes the capacity from it (else 80 GB).
std::string oom_report(const config::Recipe& spec, int world, int rank, double gpu_bytes, const std::string& what);

}  // namespace me::plan
