// `megaengine plan` and `parallel = "auto"`: every layout of a model on N nodes of G GPUs
// (tp, pp, the data parallelism left, sequence parallelism, recomputation, micro batch, the
// distributed optimizer), each with its memory estimate and step time; the ones that do not fit
// the GPU dropped, the rest ranked by step time. Tensor parallelism stays inside a node (its
// collectives run at every layer: over EFA they would cost more than the split saves; the plan
// shows by how much). The global batch and everything else of the recipe stay. No LibTorch.
#pragma once
#include <string>
#include <vector>

#include "engine/plan/device_profile.h"
#include "engine/plan/memory_estimate.h"
#include "engine/plan/step_time.h"

namespace me::plan {

struct PlanRequest {
  MemoryPlan base;  // the recipe's model, batch, precision and optimizer; its layout is a starting point only
  int nodes = 1, gpus_per_node = 8;
  DeviceProfile profile;
  double gpu_bytes = 0;  // 0: the profile's memory
};

struct LayoutCandidate {
  MemoryPlan plan;
  double memory = 0;  // bytes on the busiest stage (MemoryEstimate::total)
  StepTime time;
  std::vector<std::string> overrides;  // recipe overrides that select it, e.g. "parallel.tp=4"
};

struct PlanResult {
  std::vector<LayoutCandidate> fitting;  // fastest first
  int considered = 0;                    // layouts that divide
  int over_memory = 0;                   // of them, too large for the GPU
  LayoutCandidate smallest;              // the one needing the least memory (fitting or not)
  double capacity = 0;
};

// Enumerates and ranks. Throws me::Error when the batch cannot be kept (a global batch of 0
// with a layout whose data parallelism it depends on) or nothing divides.
PlanResult search_layouts(const PlanRequest& request);

// The best layout, or a me::Error that names the largest memory term of the smallest layout and
// what would fit (more nodes, found by trying up to 64 x as many).
LayoutCandidate best_layout(const PlanRequest& request);

// "tp 4 x pp 2 x dp 2, sequence parallel, recompute selective, micro 1, distributed optimizer"
std::string describe_layout_choice(const MemoryPlan& p);

// The report `megaengine plan` prints: the best `top` layouts with their time split, memory,
// MFU, days for `samples` samples (0: not shown), why the first beats the second, and what
// tensor parallelism across nodes would cost.
std::string plan_report(const PlanRequest& request, const PlanResult& result, int top, int64_t samples);

}  // namespace me::plan
