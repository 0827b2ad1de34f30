// CPU collectives through LibTorch's c10d ProcessGroupGloo (Debian's libtorch + libgloo-dev).
// Only in builds where gloo's headers exist (ME_HAVE_GLOO): pip's torch 2.x ships none.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <memory>

#include "engine/comm/process_group.h"

namespace c10d {
class Store;
}

namespace me::comm {

bool gloo_available();

// `store` is shared by the job; the group keeps its own key prefix inside it. `timeout`
// bounds every collective: past it the collective fails and names the missing ranks.
std::unique_ptr<ProcessGroup> make_gloo_group(std::string name, std::vector<int> global_ranks, int global_rank,
                                              const c10::intrusive_ptr<c10d::Store>& store,
                                              std::chrono::milliseconds timeout, const std::string& host);

}  // namespace me::comm
