// The optimizer step over every parameter in a few launches: the fp64 gradient norm (two
// launches, fixed summation order) and AdamW with the clipping factor and the bf16 write-back
// folded in. LibTorch's path is a norm kernel plus an add per parameter, the fused AdamW, and a
// copy kernel per parameter for the write-back.
#include "engine/kernels/common.cuh"

namespace me::kernels {
namespace {

constexpr int kThreads = 512;

// Gradient element i, widened to fp32 whatever the buffer's dtype (uniform per tensor: no divergence).
__device__ __forceinline__ float grad_at(const OptimTensor& t, int64_t i) {
  return t.grad_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(t.grad)[i]) : static_cast<const float*>(t.grad)[i];
}
// Elements i..i+3 (i a multiple of 4, the tensor's rows 16-byte aligned for fp32, 8-byte for bf16).
__device__ __forceinline__ float4 grad4_at(const OptimTensor& t, int64_t i) {
  if (!t.grad_bf16) return *reinterpret_cast<const float4*>(static_cast<const float*>(t.grad) + i);
  const uint2 b = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(t.grad) + i);
  const auto lo = *reinterpret_cast<const __nv_bfloat162*>(&b.x), hi = *reinterpret_cast<const __nv_bfloat162*>(&b.y);
  return {__low2float(lo), __high2float(lo), __low2float(hi), __high2float(hi)};
}

__global__ void chunk_sum_squares_kernel(const OptimTensor* __restrict__ tensors, const OptimChunk* __restrict__ chunks,
                                         double* __restrict__ partials) {
  const OptimChunk c = chunks[blockIdx.x];
  const OptimTensor& t = tensors[c.tensor];
  double acc = 0.0;
  if (t.in_norm) {
    const int64_t end = min(c.start + kOptimChunkElems, t.numel);
    for (int64_t i = c.start + threadIdx.x; i < end; i += blockDim.x) {
      const double g = grad_at(t, i);
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

struct AdamWUpdate {
  float decay, step_size;
  const AdamWStep& s;
  // One element: returns the new master; m and v updated in place.
  __device__ __forceinline__ float operator()(float g, float& m, float& v, float p) const {
    g *= s.grad_scale;
    p *= decay;
    m = s.beta1 * m + (1.f - s.beta1) * g;
    v = s.beta2 * v + (1.f - s.beta2) * g * g;
    const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
    return p - step_size * m / denom;
  }
};

__device__ __forceinline__ uint16_t bf16_bits(float x) {
  const __nv_bfloat16 b = __float2bfloat16(x);
  return *reinterpret_cast<const uint16_t*>(&b);
}

// Four elements per thread and 16-byte accesses where the chunk's tensors allow it (every
// parameter whose size and offsets are multiples of 4: all of a transformer's matrices), one
// at a time for the rest: the kernel moves 30 bytes per element and reaches ~91% of the copy
// bandwidth with 4-byte accesses alone.
__global__ void adamw_kernel(const OptimTensor* __restrict__ tensors, const OptimChunk* __restrict__ chunks,
                             AdamWStep s) {
  const OptimChunk c = chunks[blockIdx.x];
  const OptimTensor t = tensors[c.tensor];
  const int64_t end = min(c.start + kOptimChunkElems, t.numel);
  const AdamWUpdate update{1.f - s.lr * t.weight_decay, s.lr / s.bias_correction1, s};
  int64_t tail = c.start;
  const bool grad_aligned = t.grad_bf16 ? reinterpret_cast<uintptr_t>(static_cast<const __nv_bfloat16*>(t.grad) + c.start) % 8 == 0
                                        : detail::aligned16(static_cast<const float*>(t.grad) + c.start);
  const bool vec = detail::aligned16(t.master + c.start) && grad_aligned &&
                   detail::aligned16(t.exp_avg + c.start) && detail::aligned16(t.exp_avg_sq + c.start) &&
                   (!t.model_bf16 || reinterpret_cast<uintptr_t>(t.model_bf16 + c.start) % 8 == 0);
  if (vec) {
    const int64_t quads = (end - c.start) / 4;
    for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
      const int64_t i = c.start + 4 * q;
      const float4 g = grad4_at(t, i);
      float4 m = *reinterpret_cast<const float4*>(t.exp_avg + i), v = *reinterpret_cast<const float4*>(t.exp_avg_sq + i),
             p = *reinterpret_cast<const float4*>(t.master + i);
      p.x = update(g.x, m.x, v.x, p.x);
      p.y = update(g.y, m.y, v.y, p.y);
      p.z = update(g.z, m.z, v.z, p.z);
      p.w = update(g.w, m.w, v.w, p.w);
      *reinterpret_cast<float4*>(t.exp_avg + i) = m;
      *reinterpret_cast<float4*>(t.exp_avg_sq + i) = v;
      *reinterpret_cast<float4*>(t.master + i) = p;
      if (t.model_bf16) {
        const uint2 b{bf16_bits(p.x) | uint32_t(bf16_bits(p.y)) << 16, bf16_bits(p.z) | uint32_t(bf16_bits(p.w)) << 16};
        *reinterpret_cast<uint2*>(t.model_bf16 + i) = b;
      }
    }
    tail = c.start + 4 * quads;
  }
  for (int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) {
    float m = t.exp_avg[i], v = t.exp_avg_sq[i];
    const float p = update(grad_at(t, i), m, v, t.master[i]);
    t.exp_avg[i] = m;
    t.exp_avg_sq[i] = v;
    t.master[i] = p;
    if (t.model_bf16) t.model_bf16[i] = bf16_bits(p);
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
