// Whether a plan fits a GPU, and if not, what to change: the estimate's terms by name, the
// largest one, and the cheapest change of layout, recomputation, optimizer sharding, gradient
// dtype or micro batch (the world and the global batch stay) that makes every stage fit.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "engine/plan/memory_estimate.h"

namespace me::plan {

// A stage's terms as (name, bytes), in the order the tables print them; they add up to
// StageMemory::total (the transient is the larger of the logits and a layer's backward).
std::vector<std::pair<std::string, double>> memory_terms(const StageMemory& s, bool distributed);

struct MemoryChange {
  MemoryPlan plan;
  std::vector<std::string> overrides;  // as recipe overrides: "parallel.tp=8", "model.recompute=full"
  double cost = 0;                     // how much the change costs in speed, roughly (see .cpp)
  double total = 0;                    // bytes on the busiest stage after it
};

struct MemoryVerdict {
  bool fits = false;
  double total = 0, capacity = 0;  // bytes: the busiest stage's, and the GPU's
  int stage = 0;                   // the busiest stage
  std::string largest_term;
  double largest_bytes = 0;
  bool found = false;  // a change that fits was found
  MemoryChange change;
};

// gpu_bytes: what one GPU offers; gpus_per_node bounds tp (tensor parallelism stays on NVLink).
MemoryVerdict memory_verdict(const MemoryPlan& plan, double gpu_bytes, int gpus_per_node = 8);

// "80GB", "80 GB", "81559MiB", "79.6GiB", "85000000000": bytes (GB = 10^9, GiB = 2^30). Throws
// me::Error naming `what` on anything else.
double parse_memory_size(const std::string& text, const std::string& what = "--gpu-memory");

// 72.3 GB (10^9 bytes, one decimal), as the dry run prints sizes.
std::string format_gb(double bytes);

}  // namespace me::plan
