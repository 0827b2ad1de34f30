#include "engine/core/side_stream.h"

#if ME_TORCH_HAS_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace me {

void SideStream::run(const torch::Device& device, const std::function<void()>& work, const std::vector<torch::Tensor>& uses) {
#if ME_TORCH_HAS_CUDA
  if (device.is_cuda()) {
    if (!stream_)
      stream_ = std::make_shared<c10::cuda::CUDAStream>(
          c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index()));
    at::cuda::CUDAEvent ready;
    ready.record();
    ready.block(*stream_);
    c10::cuda::CUDAStreamGuard guard(*stream_);
    work();
    for (const auto& t : uses)
      if (t.defined()) t.record_stream(*stream_);
    return;
  }
#endif
  (void)uses;
  work();
}

}  // namespace me
