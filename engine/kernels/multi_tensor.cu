// The optimizer step over every parameter in a few launches: the fp64 gradient norm (two
// launches, fixed summation order) and AdamW with the clipping factor and the bf16 write-back
// folded in. LibTorch's path is a norm kernel plus an add per parameter, the fused AdamW, and a
// copy kernel per parameter for the write-back.
#include "engine/kernels/common.cuh"

namespace me::kernels {
namespace {

constexpr int kThreads = 512;

__global__ void chunk_sum_squares_kernel(const OptimTensor* __restrict__ tensors, const OptimChunk* __restrict__ chunks,
                                         double* __restrict__ partials) {
  const OptimChunk c = chunks[blockIdx.x];
  const OptimTensor& t = tensors[c.tensor];
  double acc = 0.0;
  if (t.in_norm) {
    const int64_t end = min(c.start + kOptimChunkElems, t.numel);
    for (int64_t i = c.start + threadIdx.x; i < end; i += blockDim.x) {
      const double g = t.grad[i];
      acc += g * g;
    }
  }
  acc = detail::block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// One block: thread k sums partials k, k + blockDim, ... in order, then a fixed tree.
__global__ void sum_partials_kernel(const double* __restrict__ partials, int64_t n, double* out) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
  acc = detail::block_sum(acc);
  if (threadIdx.x == 0) out[0] = acc;
}

__global__ void adamw_kernel(const OptimTensor* __restrict__ tensors, const OptimChunk* __restrict__ chunks,
                             AdamWStep s) {
  const OptimChunk c = chunks[blockIdx.x];
  const OptimTensor t = tensors[c.tensor];
  const int64_t end = min(c.start + kOptimChunkElems, t.numel);
  const float decay = 1.f - s.lr * t.weight_decay;
  const float step_size = s.lr / s.bias_correction1;
  for (int64_t i = c.start + threadIdx.x; i < end; i += blockDim.x) {
    const float g = t.grad[i] * s.grad_scale;
    float m = t.exp_avg[i], v = t.exp_avg_sq[i], p = t.master[i];
    p *= decay;
    m = s.beta1 * m + (1.f - s.beta1) * g;
    v = s.beta2 * v + (1.f - s.beta2) * g * g;
    const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
    p -= step_size * m / denom;
    t.exp_avg[i] = m;
    t.exp_avg_sq[i] = v;
    t.master[i] = p;
    if (t.model_bf16) {
      const __nv_bfloat16 b = __float2bfloat16(p);
      t.model_bf16[i] = *reinterpret_cast<const uint16_t*>(&b);
    }
  }
}

}  // namespace

std::vector<OptimChunk> make_chunks(const std::vector<OptimTensor>& tensors) {
  std::vector<OptimChunk> chunks;
  for (size_t k = 0; k < tensors.size(); ++k)
    for (int64_t start = 0; start < tensors[k].numel; start += kOptimChunkElems)
      chunks.push_back({static_cast<int32_t>(k), 0, start});
  return chunks;
}

void grad_sum_squares(const OptimTensor* tensors, const OptimChunk* chunks, int64_t num_chunks, double* partials,
                      double* out, void* stream) {
  auto st = detail::as_stream(stream);
  if (num_chunks == 0) {
    if (cudaMemsetAsync(out, 0, sizeof(double), st) != cudaSuccess) detail::check_launch("grad_sum_squares");
    return;
  }
  chunk_sum_squares_kernel<<<num_chunks, kThreads, 0, st>>>(tensors, chunks, partials);
  detail::check_launch("grad_sum_squares (chunks)");
  sum_partials_kernel<<<1, 1024, 0, st>>>(partials, num_chunks, out);
  detail::check_launch("grad_sum_squares (total)");
}

void adamw(const OptimTensor* tensors, const OptimChunk* chunks, int64_t num_chunks, const AdamWStep& step,
           void* stream) {
  if (num_chunks == 0) return;
  adamw_kernel<<<num_chunks, kThreads, 0, detail::as_stream(stream)>>>(tensors, chunks, step);
  detail::check_launch("adamw");
}

}  // namespace me::kernels
