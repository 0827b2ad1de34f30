// The copy engines' all-gather begins by writing this rank's rows twice, on the compute stream:
// into its slot, from which the peers pull them, and into its own place in the gathered result.
// Two cudaMemcpyAsync read the rows twice (four passes over them) and are two launches; this kernel
// reads them once (three passes). On H200 the two copies took 2 x 17.8 us a gather at the
// LLaMA-2-70B width, tp 2, nine gathers a layer and micro-batch (bench/RESULTS.md, thirty-second
// session).
#include "engine/kernels/common.cuh"

namespace me::kernels {
namespace {

// 16 bytes a thread per step: each element read once, written to both.
__global__ void copy_twice_kernel(uint4* a, uint4* b, const uint4* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = src[i];
    a[i] = v;
    b[i] = v;
  }
}

constexpr int kThreads = 256;

}  // namespace

void copy_twice(void* a, void* b, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  const auto s = detail::as_stream(stream);
  if (bytes % 16 != 0 || !detail::aligned16(a) || !detail::aligned16(b) || !detail::aligned16(src)) {
    // Rows of a shape the kernel does not take: the two copies it replaces.
    detail::check_call(cudaMemcpyAsync(a, src, bytes, cudaMemcpyDefault, s), "copy_twice", "cudaMemcpyAsync");
    detail::check_call(cudaMemcpyAsync(b, src, bytes, cudaMemcpyDefault, s), "copy_twice", "cudaMemcpyAsync");
    return;
  }
  const auto n = static_cast<int64_t>(bytes / 16);
  copy_twice_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, s>>>(static_cast<uint4*>(a), static_cast<uint4*>(b),
                                                                         static_cast<const uint4*>(src), n);
  detail::check_launch("copy_twice");
}

}  // namespace me::kernels
