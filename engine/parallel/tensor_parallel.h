// The tensor-parallel setting a layer is built with: the group its shards talk over (none
// means tp = 1: every mapping is the identity) and whether activations outside the
// tensor-parallel regions are split along the sequence (sequence parallelism).
#pragma once
#include "engine/comm/process_group.h"

namespace me::parallel {

struct TensorParallel {
  comm::ProcessGroup* group = nullptr;  // not owned; outlives the model
  bool sequence_parallel = false;
  // Column-parallel layers reduce their input gradient on a side stream while their weight
  // gradient is computed (parallel::linear); false: in line, for A/B comparisons.
  bool overlap_comm = true;

  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
  bool active() const { return size() > 1; }
};

}  // namespace me::parallel
