// A CUDA stream of one's own for work that should overlap what the caller queues next
// (collectives beside compute): run() queues `work` on it after everything already queued on
// the current stream. For CPU tensors, or in a build without CUDA LibTorch, work runs as is.
// `uses`: tensors the work reads or writes that the caller may drop before the side stream is
// done with them (the allocator then waits for the side stream before reusing their memory).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

namespace c10::cuda {
class CUDAStream;
}

namespace me {

class SideStream {
 public:
  // `device`: where the work's tensors live. The stream is taken from LibTorch's pool (high
  // priority) on first use.
  void run(const torch::Device& device, const std::function<void()>& work, const std::vector<torch::Tensor>& uses = {});

 private:
  std::shared_ptr<c10::cuda::CUDAStream> stream_;
};

}  // namespace me
