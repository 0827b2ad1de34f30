// GPU collectives through NCCL's C API, on the current CUDA stream of the tensor's device
// (ME_HAVE_NCCL builds). Compiled on the CPU machines too (without being linked) so the
// backend cannot rot between GPU sessions.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <memory>

#include "engine/comm/process_group.h"

namespace c10d {
class Store;
}

namespace me::comm {

bool nccl_available();
std::string nccl_version();

// Selects and sets this process's GPU from its local rank (see pick_cuda_device); with
// bind_cpus, moves the process's threads to the CPUs local to that GPU (launch/cpu_affinity.h),
// its slice of them when other local ranks' GPUs (of local_world) have the same, and sets
// *binding to what was done.
int select_cuda_device(int local_rank, int local_world = 1, bool bind_cpus = false, std::string* binding = nullptr);

// One NCCL communicator per group, made from a fresh unique id that the group's first rank
// publishes through the store. Every member must call this with the same name. `cta_policy`:
// CommOptions::nccl_cta_policy.
std::unique_ptr<ProcessGroup> make_nccl_group(std::string name, std::vector<int> global_ranks, int global_rank,
                                              const c10::intrusive_ptr<c10d::Store>& store,
                                              std::chrono::milliseconds timeout, int device,
                                              const std::string& cta_policy = "default");

}  // namespace me::comm
