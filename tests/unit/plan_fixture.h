// What the plan tests (test_memory_estimate.cpp, test_planner.cpp) build their cases from.
#pragma once
#include "engine/plan/memory_estimate.h"

namespace me::plan::test {

// A bf16 plan of config `c` on `world` GPUs at tp x pp, micro batch `micro`, global batch
// `global` (0: micro x dp).
inline MemoryPlan plan_of(const model::TransformerConfig& c, int world, int tp, int pp, int64_t micro, int64_t global = 0) {
  MemoryPlan p;
  p.model = c;
  p.world = world, p.tp = tp, p.pp = pp, p.micro_batch = micro, p.global_batch = global;
  p.precision = "bf16";
  return p;
}

}  // namespace me::plan::test
