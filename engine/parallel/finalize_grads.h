// After backward, before the optimizer: the gradient buffer made ready for the update, as
// Megatron's finalize_model_grads. Data-parallel reduction finishes (buckets reduced as
// backward filled them, the rest now), then the gradients of replicated parameters that each
// rank saw only part of are summed:
// - the tied word embedding held by the first and the last pipeline stage (its lookup and its
//   output layer): over the embedding group, before its data-parallel reduction, since the
//   stages lay their buffers out differently;
// - under sequence parallelism the norms' and row biases' (each tensor-parallel rank saw its
//   slice of the positions): over tensor parallelism, after the data-parallel reduction and only
//   the pieces this rank reduced (tensor-parallel ranks share a layout).
// Last, fp16's loss scale is divided out, before the gradient norm.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/comm/process_group.h"
#include "engine/parallel/grad_buffer.h"

namespace me::parallel {

struct SharedGradients {
  int64_t tied_embedding = -1;  // the parameter index of the tied word embedding; -1: none
  comm::ProcessGroup* embedding_group = nullptr;
  std::vector<size_t> sequence_parallel;  // parameter indices
  comm::ProcessGroup* tp_group = nullptr;
};

void finalize_grads(GradBuffer& grads, const SharedGradients& shared, double loss_scale);

}  // namespace me::parallel
