// Activation buffers in memory the tensor-parallel group registers (NCCL symmetric windows) for
// the sequence-parallel all-gathers: NCCL's symmetric kernels gather 16-64 MB into a window 2-4x
// faster than into ordinary memory on 2 x H200, and with the zero-CTA policy on the copy engines
// (bench/RESULTS.md, ninth session).
//
// All slots have one size (the first request's). A tensor taken from a slot gives it back when
// its storage dies. The TP ranks run the same program, so they take and give back slots in the
// same order and a tensor lies at the same offset of its window on every rank, as NCCL's
// symmetric collectives require. New slots are registered (a collective) only when none is
// free, which every rank finds at the same point; past the byte limit, or for a request larger
// than a slot, take() returns nothing and the caller uses ordinary memory.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>

namespace me::parallel {

class SymmetricSlots {
 public:
  // `allocate(bytes)`: a 1-D uint8 tensor of that many bytes, registered with the group by every
  // member together (comm::ProcessGroup::empty_symmetric).
  using Allocate = std::function<torch::Tensor(int64_t bytes)>;
  SymmetricSlots(Allocate allocate, int64_t max_bytes);

  // A contiguous tensor of `sizes` and `options`' dtype in a free slot, or an undefined one.
  torch::Tensor take(at::IntArrayRef sizes, const torch::TensorOptions& options);
  int64_t registered_bytes() const;
  int64_t fallbacks() const;  // requests answered with nothing (no room)

 private:
  struct State;
  std::shared_ptr<State> state_;  // the tensors' deleters hold it weakly
};

}  // namespace me::parallel
