// Residual add + LayerNorm / RMSNorm, forward in one pass and backward in one pass plus a small
// column sum. The composition it replaces is an add kernel, then layer_norm / rms_norm reading
// the sum back (and its backward reading the input and grad_y twice); here each row is read
// once into registers, its statistics are taken there (the variance in two passes over the
// registers, not E[x^2] - E[x]^2), and every output is written once.
#include <algorithm>
#include <array>
#include <atomic>

#include "engine/kernels/common.cuh"

namespace me::kernels {
namespace {

using detail::from_float;
using detail::to_float;
using detail::Vec;

constexpr int64_t kMaxHidden = 16384;
// Blocks of 8 warps (or one team, if a row needs more), built for 2 resident per SM (at most 128
// registers a thread) where a team fits in 8 warps; larger teams (bf16 hidden > 8192, fp32 >
// 4096) fit one block per SM, so backward's 2 blocks per SM then run in two waves. Backward
// launches at most 2 per SM: its scratch holds one partial row per block.
constexpr int kBlockWarps = 8;
constexpr int kBackwardBlocksPerSM = 2;

// A row belongs to a team of WPR warps. Team thread t holds the vectors t, t + 32 WPR, ...
// (NV = E / V vectors of V elements, E elements in all), so each warp access is contiguous;
// the last vectors of a short row are predicated off.
template <int E, int WPR>
struct Shape {
  static constexpr int kElems = E, kTeamWarps = WPR;
};

__host__ __device__ constexpr int block_warps(int wpr) { return wpr > kBlockWarps ? wpr : kBlockWarps; }
__host__ __device__ constexpr int min_blocks(int wpr) { return wpr > kBlockWarps ? 1 : 2; }

// Calls f(Shape<E, WPR>{}) for the smallest team whose threads hold at most kMaxE elements of
// a row of `hidden` (kMaxE: what fits in 128 registers beside the rest of the kernel's state).
template <int kMaxE, typename F>
void with_shape(int64_t hidden, F&& f) {
  static_assert(kMaxE == 8 || kMaxE == 16 || kMaxE == 32, "elements per thread");
  if (hidden <= 32 * 8) return f(Shape<8, 1>{});
  if constexpr (kMaxE >= 16) {
    if (hidden <= 32 * 16) return f(Shape<16, 1>{});
  }
  if constexpr (kMaxE >= 32) {
    if (hidden <= 32 * 32) return f(Shape<32, 1>{});
  }
  constexpr int64_t per_warp = 32 * kMaxE;
  if (hidden <= 2 * per_warp) return f(Shape<kMaxE, 2>{});
  if (hidden <= 4 * per_warp) return f(Shape<kMaxE, 4>{});
  if constexpr (kMaxHidden > 4 * per_warp) {
    if (hidden <= 8 * per_warp) return f(Shape<kMaxE, 8>{});
  }
  if constexpr (kMaxHidden > 8 * per_warp) {
    if (hidden <= 16 * per_warp) return f(Shape<kMaxE, 16>{});
  }
  if constexpr (kMaxHidden > 16 * per_warp) {
    if (hidden <= 32 * per_warp) return f(Shape<kMaxE, 32>{});
  }
  throw std::runtime_error("add_norm: hidden " + std::to_string(hidden) + " is not supported");
}

__device__ __forceinline__ float2 operator+(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
__device__ __forceinline__ float warp_total(float x) { return detail::warp_sum(x); }
__device__ __forceinline__ float2 warp_total(float2 x) {
  return make_float2(detail::warp_sum(x.x), detail::warp_sum(x.y));
}

// Team t of a block synchronises on named barrier t + 1 (0 is __syncthreads): teams of one block
// do not wait for each other.
template <int WPR>
__device__ __forceinline__ void team_barrier() {
  asm volatile("bar.sync %0, %1;" ::"r"(1 + static_cast<int>(threadIdx.x) / (32 * WPR)), "r"(32 * WPR) : "memory");
}

// Sum over the team; every thread of the team gets the same bits (xor butterflies, then the
// warps' sums added in one fixed order). Teams larger than a warp go through shared memory, so
// every thread of the team must call it, active row or not.
template <int WPR, typename S>
__device__ __forceinline__ S team_sum(S x, S* partial) {
  x = warp_total(x);
  if constexpr (WPR == 1) {
    return x;
  } else {
    const int warp = threadIdx.x / 32, first = warp / WPR * WPR;
    if (threadIdx.x % 32 == 0) partial[warp] = x;
    team_barrier<WPR>();
    S s = partial[first];
#pragma unroll
    for (int w = 1; w < WPR; ++w) s = s + partial[first + w];
    team_barrier<WPR>();  // partial is written again by the next call
    return s;
  }
}

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}
template <typename T, int V>
__device__ __forceinline__ void store(T* p, const Vec<T, V>& v) {
  *reinterpret_cast<Vec<T, V>*>(p) = v;
}

// Streamed tensors are not __restrict__: each element is read before the thread that reads it
// writes it, so the outputs may alias the inputs (in place). The loads of a row are all issued
// before its first store for the same reason (a store the compiler must order them after would
// serialise their latencies).
template <typename T, int V, int E, int WPR>
__global__ void __launch_bounds__(32 * block_warps(WPR), min_blocks(WPR))
    forward_kernel(bool rms, const T* x, const T* delta, const T* __restrict__ weight, const T* __restrict__ bias,
                   T* sum_out, T* y, float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows,
                   int hidden, float eps) {
  constexpr int NV = E / V, kTeam = 32 * WPR, kRowsPerBlock = block_warps(WPR) / WPR;
  __shared__ float partial[block_warps(WPR)];
  const int t = threadIdx.x % kTeam, nvec = hidden / V;
  const int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / kTeam;
  const bool active = row < rows;
  const int64_t base = row * hidden;

  Vec<T, V> a[NV], d[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int j = t + k * kTeam;
    if (active && j < nvec) {
      a[k] = load<T, V>(x + base + int64_t{j} * V);
      if (delta) d[k] = load<T, V>(delta + base + int64_t{j} * V);
    }
  }
  float v[NV][V];
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int j = t + k * kTeam;
    const bool valid = active && j < nvec;
    if (valid && delta) {
      // Rounded to T first: the statistics are of the sum a separate add would have stored.
#pragma unroll
      for (int i = 0; i < V; ++i) a[k].v[i] = from_float<T>(to_float(a[k].v[i]) + to_float(d[k].v[i]));
      store<T, V>(sum_out + base + int64_t{j} * V, a[k]);
    }
#pragma unroll
    for (int i = 0; i < V; ++i) {
      v[k][i] = valid ? to_float(a[k].v[i]) : 0.f;
      sum += v[k][i];
    }
  }
  const float inv_n = 1.f / static_cast<float>(hidden);
  float mean = 0.f;
  if (!rms) mean = team_sum<WPR>(sum, partial) * inv_n;
  float sq = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const bool valid = active && t + k * kTeam < nvec;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float c = v[k][i] - mean;
      sq += valid ? c * c : 0.f;
    }
  }
  const float rstd = rsqrtf(team_sum<WPR>(sq, partial) * inv_n + eps);
  if (active && t == 0) {
    if (!rms && mean_out) mean_out[row] = mean;
    if (rstd_out) rstd_out[row] = rstd;
  }
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int j = t + k * kTeam;
    if (!(active && j < nvec)) continue;
    const auto w = load<T, V>(weight + int64_t{j} * V);
    Vec<T, V> b;
    if (bias) b = load<T, V>(bias + int64_t{j} * V);
    Vec<T, V> out;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float n = (v[k][i] - mean) * rstd * to_float(w.v[i]);
      out.v[i] = from_float<T>(bias ? n + to_float(b.v[i]) : n);
    }
    store<T, V>(y + base + int64_t{j} * V, out);
  }
}

// Hides v's bits from the optimiser: the second pass over a row then recomputes xhat and g from
// the packed inputs instead of keeping the first pass's fp32 values alive across the team sum
// (twice the registers, which would cost occupancy).
template <typename T, int V>
__device__ __forceinline__ void opaque(Vec<T, V>& v) {
  if constexpr (sizeof(v) % 4 == 0) {
    auto* u = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(v) / 4); ++i) asm volatile("" : "+r"(u[i]));
  } else {
    auto* u = reinterpret_cast<unsigned short*>(&v);
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(v) / 2); ++i) asm volatile("" : "+h"(u[i]));
  }
}

// Bytes of dynamic shared memory: each thread's grad_weight and grad_bias columns.
template <int E, int WPR>
constexpr int backward_smem() {
  return 2 * E * 32 * block_warps(WPR) * static_cast<int>(sizeof(float));
}

// Each team walks rows (grid-stride) and adds its columns' grad_weight / grad_bias terms to
// accumulators in shared memory that only the owning thread touches (in registers they would
// cost the occupancy that keeps enough loads in flight). At the end the block adds its teams in
// order and writes one partial row of each to scratch. The row's second pass recomputes from the
// packed inputs (see opaque) and rstd is folded into the constants: fewer instructions and
// registers per element, which is what this kernel is short of.
template <typename T, int V, int E, int WPR, bool kParams>
__global__ void __launch_bounds__(32 * block_warps(WPR), min_blocks(WPR))
    backward_kernel(bool rms, const T* grad_y, const T* grad_sum, const T* input, const float* __restrict__ mean,
                    const float* __restrict__ rstd, const T* __restrict__ weight, T* grad_in,
                    float* __restrict__ partial_w, float* __restrict__ partial_b, int64_t rows, int hidden) {
  constexpr int NV = E / V, E4 = E / 4, kTeam = 32 * WPR, kThreads = 32 * block_warps(WPR);
  constexpr int kRowsPerBlock = kThreads / kTeam;
  static_assert(E % 4 == 0 && (WPR == 1 || kRowsPerBlock <= 15), "named barriers 1..15");
  __shared__ float2 partial[kThreads / 32];
  extern __shared__ float4 acc[];  // [2][E4][kThreads]: float4 e4 of this thread's weight, bias columns
  const int t = threadIdx.x % kTeam, team = threadIdx.x / kTeam, nvec = hidden / V;
  const float inv_n = 1.f / static_cast<float>(hidden);
  const bool want_b = kParams && partial_b != nullptr;
#if __CUDA_ARCH__ >= 900
  if constexpr (kParams) asm volatile("griddepcontrol.launch_dependents;");  // the column sum may start launching now
#endif

  Vec<T, V> w[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (t + k * kTeam < nvec) w[k] = load<T, V>(weight + int64_t{t + k * kTeam} * V);
  if constexpr (kParams) {
#pragma unroll
    for (int e4 = 0; e4 < 2 * E4; ++e4) acc[e4 * kThreads + threadIdx.x] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  for (int64_t row = int64_t{blockIdx.x} * kRowsPerBlock + team; row - team < rows;
       row += int64_t{gridDim.x} * kRowsPerBlock) {
    const bool active = row < rows;
    const int64_t base = row * hidden;
    Vec<T, V> in[NV], dy[NV], gs[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int64_t j = t + k * kTeam;
      if (active && j < nvec) {
        in[k] = load<T, V>(input + base + j * V);
        dy[k] = load<T, V>(grad_y + base + j * V);
        if (grad_sum) gs[k] = load<T, V>(grad_sum + base + j * V);
      }
    }
    const float r = active ? rstd[row] : 0.f, mr = active && !rms ? mean[row] * r : 0.f;
    float2 s = make_float2(0.f, 0.f);  // sum of g, sum of g * xhat
    if (active) {
#pragma unroll
      for (int e4 = 0; e4 < E4; ++e4) {
        float dw[4], db[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int e = 4 * e4 + c, k = e / V, i = e % V;
          dw[c] = db[c] = 0.f;
          if (t + k * kTeam < nvec) {
            const float xhat = to_float(in[k].v[i]) * r - mr, d = to_float(dy[k].v[i]);
            const float g = d * to_float(w[k].v[i]);
            s.x += g;
            s.y += g * xhat;
            dw[c] = d * xhat;
            db[c] = d;
          }
        }
        if constexpr (!kParams) continue;
        float4& aw = acc[e4 * kThreads + threadIdx.x];
        aw = make_float4(aw.x + dw[0], aw.y + dw[1], aw.z + dw[2], aw.w + dw[3]);
        if (want_b) {
          float4& ab = acc[(E4 + e4) * kThreads + threadIdx.x];
          ab = make_float4(ab.x + db[0], ab.y + db[1], ab.z + db[2], ab.w + db[3]);
        }
      }
    }
    s = team_sum<WPR>(s, partial);
    const float rc1 = rms ? 0.f : r * s.x * inv_n, rc2 = r * s.y * inv_n;  // rstd * the two row means
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int j = t + k * kTeam;
      if (!(active && j < nvec)) continue;
      opaque(in[k]);
      opaque(dy[k]);
      opaque(w[k]);
      Vec<T, V> out;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float xhat = to_float(in[k].v[i]) * r - mr, g = to_float(dy[k].v[i]) * to_float(w[k].v[i]);
        const float dx = g * r - (rc1 + xhat * rc2);
        out.v[i] = from_float<T>(grad_sum ? dx + to_float(gs[k].v[i]) : dx);
      }
      store<T, V>(grad_in + base + int64_t{j} * V, out);
    }
  }

  // Team thread t of every team holds the same columns: the first team adds the teams in order
  // (deterministic) and writes the block's partial rows.
  if constexpr (!kParams) return;
  __syncthreads();
  if (team != 0) return;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    float* out = q == 0 ? partial_w : partial_b;
    if (!out) continue;
    out += int64_t{blockIdx.x} * hidden;
#pragma unroll
    for (int e4 = 0; e4 < E4; ++e4) {
      float4 sum = acc[(q * E4 + e4) * kThreads + t];
      for (int m = 1; m < kRowsPerBlock; ++m) {
        const float4 a = acc[(q * E4 + e4) * kThreads + m * kTeam + t];
        sum = make_float4(sum.x + a.x, sum.y + a.y, sum.z + a.z, sum.w + a.w);
      }
      const float v4[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int e = 4 * e4 + c, k = e / V, i = e % V;
        if (t + k * kTeam < nvec) out[(t + k * kTeam) * V + i] = v4[c];
      }
    }
  }
}

// out[c] = sum over blocks b of partial[b * hidden + c]. A block takes 32 columns: its 32 warps
// each sum every 32nd partial row (independent loads, all in flight at once), then one warp adds
// the 32 sums in order (deterministic). blockIdx.y: weight, then bias.
constexpr int kSumSlices = 32;
__global__ void __launch_bounds__(32 * kSumSlices)
    column_sum_kernel(const float* __restrict__ partial_w, const float* __restrict__ partial_b, int blocks,
                      int hidden, float* __restrict__ grad_w, float* __restrict__ grad_b) {
  __shared__ float sums[kSumSlices][33];
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // launched early (see add_norm_backward)
#endif
  const float* part = blockIdx.y == 0 ? partial_w : partial_b;
  float* out = blockIdx.y == 0 ? grad_w : grad_b;
  const int c = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.f;
  if (c < hidden) {
#pragma unroll 8
    for (int b = threadIdx.y; b < blocks; b += kSumSlices) acc += part[int64_t{b} * hidden + c];
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < hidden) {
    float s = sums[0][threadIdx.x];
    for (int m = 1; m < kSumSlices; ++m) s += sums[m][threadIdx.x];
    out[c] = s;
  }
}

// The two-pass backward's second pass (see add_norm_backward): grad_weight and grad_bias of 64
// columns over one slice of the rows (blockIdx.y of gridDim.y), into that slice's partial row.
// Lane l holds columns 2l and 2l + 1 (coalesced: a warp reads 64 contiguous elements of a row);
// the 8 warps take every 8th row, 4 rows' loads in flight at a time, and are added in order at
// the end (deterministic).
constexpr int kParamCols = 64, kParamWarps = 8, kParamUnroll = 4;
template <typename T, bool kPair>
__global__ void __launch_bounds__(32 * kParamWarps)
    param_grads_kernel(bool rms, const T* __restrict__ grad_y, const T* __restrict__ input,
                       const float* __restrict__ mean, const float* __restrict__ rstd, float* __restrict__ partial_w,
                       float* __restrict__ partial_b, int64_t rows, int hidden) {
  __shared__ float sums[2][kParamWarps][kParamCols];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int c0 = blockIdx.x * kParamCols + 2 * lane;
  const int64_t first = rows * blockIdx.y / gridDim.y, last = rows * (blockIdx.y + 1) / gridDim.y;
  const bool has0 = c0 < hidden, has1 = c0 + 1 < hidden;
  float dw0 = 0.f, dw1 = 0.f, db0 = 0.f, db1 = 0.f;
  for (int64_t r0 = first + warp; r0 < last; r0 += kParamWarps * kParamUnroll) {
    float x[kParamUnroll][2], d[kParamUnroll][2], r[kParamUnroll], mr[kParamUnroll];
#pragma unroll
    for (int u = 0; u < kParamUnroll; ++u) {
      const int64_t row = r0 + int64_t{u} * kParamWarps;
      const bool ok = row < last;
      const int64_t o = row * hidden + c0;
      if constexpr (kPair) {  // hidden even, rows 2-element aligned: both columns in one load
        Vec<T, 2> xv, dv;
        if (ok && has0) xv = load<T, 2>(input + o), dv = load<T, 2>(grad_y + o);
        x[u][0] = ok && has0 ? to_float(xv.v[0]) : 0.f;
        x[u][1] = ok && has0 ? to_float(xv.v[1]) : 0.f;
        d[u][0] = ok && has0 ? to_float(dv.v[0]) : 0.f;
        d[u][1] = ok && has0 ? to_float(dv.v[1]) : 0.f;
      } else {
        x[u][0] = ok && has0 ? to_float(input[o]) : 0.f;
        x[u][1] = ok && has1 ? to_float(input[o + 1]) : 0.f;
        d[u][0] = ok && has0 ? to_float(grad_y[o]) : 0.f;
        d[u][1] = ok && has1 ? to_float(grad_y[o + 1]) : 0.f;
      }
      r[u] = ok ? rstd[row] : 0.f;
      mr[u] = ok && !rms ? mean[row] * r[u] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kParamUnroll; ++u) {
      // xhat as the first pass forms it: x * rstd - mean * rstd.
      dw0 += d[u][0] * (x[u][0] * r[u] - mr[u]);
      dw1 += d[u][1] * (x[u][1] * r[u] - mr[u]);
      db0 += d[u][0];
      db1 += d[u][1];
    }
  }
  sums[0][warp][2 * lane] = dw0;
  sums[0][warp][2 * lane + 1] = dw1;
  sums[1][warp][2 * lane] = db0;
  sums[1][warp][2 * lane + 1] = db1;
  __syncthreads();
  if (threadIdx.x >= 2 * kParamCols) return;
  const int q = threadIdx.x / kParamCols, j = threadIdx.x % kParamCols, c = blockIdx.x * kParamCols + j;
  float* out = q == 0 ? partial_w : partial_b;
  if (!out || c >= hidden) return;
  float s = sums[q][0][j];
#pragma unroll
  for (int w = 1; w < kParamWarps; ++w) s += sums[q][w][j];
  out[int64_t{blockIdx.y} * hidden + c] = s;
}

// Multiprocessors of the current device, asked once per device.
int sm_count() {
  static std::array<std::atomic<int>, 64> cache{};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) throw std::runtime_error(std::string("add_norm: cudaGetDevice: ") + cudaGetErrorString(e));
  const bool cached = dev >= 0 && dev < static_cast<int>(cache.size());
  int n = cached ? cache[dev].load(std::memory_order_relaxed) : 0;
  if (n == 0) {
    e = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) throw std::runtime_error(std::string("add_norm: SM count: ") + cudaGetErrorString(e));
    if (cached) cache[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

int64_t backward_max_blocks() { return int64_t{kBackwardBlocksPerSM} * sm_count(); }

}  // namespace

bool add_norm_supported(int64_t hidden) { return hidden >= 1 && hidden <= kMaxHidden; }

void add_norm_forward(DType t, bool rms, const void* x, const void* delta, const void* weight, const void* bias,
                      void* sum_out, void* y, float* mean, float* rstd, int64_t rows, int64_t hidden, float eps,
                      void* stream) {
  if (rows == 0) return;
  if (!add_norm_supported(hidden))
    throw std::runtime_error("add_norm_forward: hidden " + std::to_string(hidden) + " is not supported");
  ME_DISPATCH_FLOAT(t, "add_norm_forward", {
    const auto* px = static_cast<const scalar_t*>(x);
    const auto* pd = static_cast<const scalar_t*>(delta);
    const auto* pw = static_cast<const scalar_t*>(weight);
    const auto* pb = static_cast<const scalar_t*>(bias);
    auto* ps = static_cast<scalar_t*>(sum_out);
    auto* py = static_cast<scalar_t*>(y);
    constexpr int V = detail::kVec16<scalar_t>;
    // Null pointers count as aligned: they are never read.
    const bool vec = hidden % V == 0 && detail::aligned16(px) && detail::aligned16(pd) && detail::aligned16(pw) &&
                     detail::aligned16(pb) && detail::aligned16(ps) && detail::aligned16(py);
    with_shape<32>(hidden, [&](auto shape) {  // 32 elements of x and of delta per thread
      using S = decltype(shape);
      constexpr int threads = 32 * block_warps(S::kTeamWarps), per_block = threads / (32 * S::kTeamWarps);
      const auto blocks = static_cast<unsigned>((rows + per_block - 1) / per_block);
      const auto kernel = vec ? forward_kernel<scalar_t, V, S::kElems, S::kTeamWarps>
                              : forward_kernel<scalar_t, 1, S::kElems, S::kTeamWarps>;
      kernel<<<blocks, threads, 0, detail::as_stream(stream)>>>(rms, px, pd, pw, pb, ps, py, mean, rstd, rows,
                                                                static_cast<int>(hidden), eps);
    });
  });
  detail::check_launch("add_norm_forward");
}

int64_t add_norm_scratch_floats(int64_t rows, int64_t hidden) {
  return 2 * hidden * std::min(rows, backward_max_blocks());
}

bool add_norm_backward_two_pass(DType t, int64_t rows, int64_t hidden) {
  // The fused pass keeps each thread's grad_weight / grad_bias columns in shared memory and writes
  // one partial row of each per block (2 per SM, each walking rows / (2 x SMs) rows): with wide
  // rows and few of them, the partial rows cost as many bytes as the rows (512 rows of 8192 bf16,
  // tp 4 + SP at the GPT-39B width: 55 us in one pass, 22 in two; H100, dev/cuda/add_norm). Two
  // passes (rows without the columns' sums, then the sums by columns) read input and grad_y twice
  // instead. Measured there: two passes win at 512 and 1024 rows of 8192 (LayerNorm 47 against 66
  // us, RMSNorm 44 against 48), tie or lose from 2048 (RMSNorm 83 against 70) and at 2048 wide.
  return hidden * static_cast<int64_t>(t == DType::f32 ? 4 : 2) > 8192 && rows <= 4 * backward_max_blocks();
}

void add_norm_backward(DType t, bool rms, const void* grad_y, const void* grad_sum, const void* input,
                       const float* mean, const float* rstd, const void* weight, void* grad_in, float* grad_weight,
                       float* grad_bias, float* scratch, int64_t rows, int64_t hidden, void* stream,
                       NormBackwardPasses passes) {
  if (rows == 0) return;
  if (!add_norm_supported(hidden))
    throw std::runtime_error("add_norm_backward: hidden " + std::to_string(hidden) + " is not supported");
  const bool two_pass = passes == NormBackwardPasses::two ||
                        (passes == NormBackwardPasses::automatic && add_norm_backward_two_pass(t, rows, hidden));
  auto st = detail::as_stream(stream);
  const int64_t max_blocks = std::min(rows, backward_max_blocks());  // the scratch holds this many partial rows
  float* const partial_w = scratch;
  float* const partial_b = scratch + max_blocks * hidden;  // written only with grad_bias
  int partial_rows = 0;
  ME_DISPATCH_FLOAT(t, "add_norm_backward", {
    const auto* pdy = static_cast<const scalar_t*>(grad_y);
    const auto* pgs = static_cast<const scalar_t*>(grad_sum);
    const auto* pin = static_cast<const scalar_t*>(input);
    const auto* pw = static_cast<const scalar_t*>(weight);
    auto* pdx = static_cast<scalar_t*>(grad_in);
    constexpr int V = detail::kVec16<scalar_t>;
    const bool vec = hidden % V == 0 && detail::aligned16(pdy) && detail::aligned16(pgs) && detail::aligned16(pin) &&
                     detail::aligned16(pw) && detail::aligned16(pdx);
    // 64 bytes of each streamed input per thread (input, grad_y, grad_sum, and the weights).
    constexpr int kMaxE = 64 / static_cast<int>(sizeof(scalar_t));
    with_shape<kMaxE>(hidden, [&](auto shape) {
      using S = decltype(shape);
      constexpr int threads = 32 * block_warps(S::kTeamWarps), per_block = threads / (32 * S::kTeamWarps);
      const int64_t groups = (rows + per_block - 1) / per_block;
      if (two_pass) {
        // First pass: grad_in only, a team per row, every row at once.
        const int blocks = static_cast<int>(std::min<int64_t>(groups, 65535 * 8));
        const auto kernel = vec ? backward_kernel<scalar_t, V, S::kElems, S::kTeamWarps, false>
                                : backward_kernel<scalar_t, 1, S::kElems, S::kTeamWarps, false>;
        kernel<<<blocks, threads, 0, st>>>(rms, pdy, pgs, pin, mean, rstd, pw, pdx, nullptr, nullptr, rows,
                                           static_cast<int>(hidden));
        detail::check_launch("add_norm_backward (rows)");
        // Second pass: the columns' sums over slices of the rows, about 4 blocks per SM in all,
        // each slice at least 32 rows.
        const int64_t col_blocks = (hidden + kParamCols - 1) / kParamCols;
        const int64_t want = (4 * int64_t{sm_count()} + col_blocks - 1) / col_blocks;
        partial_rows = static_cast<int>(std::max<int64_t>(1, std::min({want, rows / 32, max_blocks})));
        const bool pair = hidden % 2 == 0 && reinterpret_cast<uintptr_t>(pdy) % (2 * sizeof(scalar_t)) == 0 &&
                          reinterpret_cast<uintptr_t>(pin) % (2 * sizeof(scalar_t)) == 0;
        const auto params = pair ? param_grads_kernel<scalar_t, true> : param_grads_kernel<scalar_t, false>;
        params<<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(partial_rows)), 32 * kParamWarps, 0,
                 st>>>(rms, pdy, pin, mean, rstd, partial_w, grad_bias ? partial_b : nullptr, rows,
                       static_cast<int>(hidden));
        detail::check_launch("add_norm_backward (columns)");
        return;
      }
      constexpr int smem = backward_smem<S::kElems, S::kTeamWarps>();
      // As few rounds over the rows as max_blocks allows, then as few blocks as need no more
      // rounds: every team walks the same number of rows, or one fewer.
      const int64_t rounds = (groups + max_blocks - 1) / max_blocks;
      partial_rows = static_cast<int>((groups + rounds - 1) / rounds);
      const auto kernel = vec ? backward_kernel<scalar_t, V, S::kElems, S::kTeamWarps, true>
                              : backward_kernel<scalar_t, 1, S::kElems, S::kTeamWarps, true>;
      if (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) throw std::runtime_error(std::string("add_norm_backward: ") + cudaGetErrorString(e));
      }
      kernel<<<partial_rows, threads, smem, st>>>(rms, pdy, pgs, pin, mean, rstd, pw, pdx, partial_w,
                                                  grad_bias ? partial_b : nullptr, rows, static_cast<int>(hidden));
      detail::check_launch("add_norm_backward");
    });
  });
  // Programmatic dependent launch: the column sum is launched while the kernel before it runs and
  // waits for it inside (griddepcontrol.wait), which hides its launch latency.
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>((hidden + 31) / 32), grad_bias ? 2 : 1);
  cfg.blockDim = dim3(32, kSumSlices);
  cfg.stream = st;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, column_sum_kernel, static_cast<const float*>(partial_w),
                                           static_cast<const float*>(partial_b),
                                           partial_rows, static_cast<int>(hidden), grad_weight, grad_bias);
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA kernel add_norm_backward (column sums): ") + cudaGetErrorString(e));
}

}  // namespace me::kernels
