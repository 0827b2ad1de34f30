// Every difference between the two LibTorch builds lives here: Debian's libtorch 1.13
// (CPU machines, CI) and torch 2.11+cu130 (the GPU machine, the container).
#pragma once
#include <torch/torch.h>
#include <torch/version.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// ME_TORCH_HAS_CUDA: set by CMake when LibTorch was built with CUDA (the GPU machine).
#if ME_TORCH_HAS_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif
#include <ATen/CPUGeneratorImpl.h>

#define ME_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// at::scaled_dot_product_attention (flash / memory-efficient kernels) arrived in 2.0, its
// enable_gqa (keys/values with fewer heads, no copies) in 2.5; at::_fused_adamw_ in 2.0.
#define ME_HAS_SDPA ME_TORCH_AT_LEAST(2, 0)
#define ME_HAS_SDPA_GQA ME_TORCH_AT_LEAST(2, 5)
#define ME_HAS_FUSED_ADAMW ME_TORCH_AT_LEAST(2, 0)
// at::rms_norm arrived in 2.4 (a fused CUDA kernel behind it in later releases).
#define ME_HAS_RMS_NORM ME_TORCH_AT_LEAST(2, 4)
// c10d::Store, which our rendezvous store derives from (engine/comm/job_store.h). 1.13's has
// neither of these; 2.11's (torch/csrc/distributed/c10d/Store.hpp, read from the 2.11.0+cu130
// install) has clone() as a pure virtual, and append / multiGet / multiSet / hasExtendedApi as
// virtuals with non-atomic defaults built on get and set. Both came during 2.x; 2.5 is taken as
// the first release with them (the releases in between were not checked: a build against one
// that lacks them fails at the `override`, which points here).
#define ME_C10D_STORE_HAS_CLONE ME_TORCH_AT_LEAST(2, 5)
#define ME_C10D_STORE_HAS_EXTENDED_API ME_TORCH_AT_LEAST(2, 5)

namespace me::compat {

namespace detail {
template <typename C, typename = void>
struct HasSmCarveout : std::false_type {};
template <typename C>
struct HasSmCarveout<C, std::void_t<decltype(std::declval<C&>()._setSMCarveout_EXPERIMENTAL(std::optional<int32_t>{}))>>
    : std::true_type {};
template <typename C, typename = void>
struct HasAccumulateGradStreamWarning : std::false_type {};
template <typename C>
struct HasAccumulateGradStreamWarning<
    C, std::void_t<decltype(std::declval<C&>().setWarnOnAccumulateGradStreamMismatch(false))>> : std::true_type {};
}  // namespace detail

// Whether autograd warns when a gradient accumulator's stream is not the stream its gradient was
// made on (recent releases only; detected, not assumed). CUDA graphs of the blocks make their
// parameters' accumulators on the capture stream on purpose (model/block_graphs.cpp).
template <typename C = at::Context>
inline void set_warn_on_accumulate_grad_stream_mismatch(bool on, C& context = at::globalContext()) {
  if constexpr (detail::HasAccumulateGradStreamWarning<C>::value) context.setWarnOnAccumulateGradStreamMismatch(on);
  else (void)on, (void)context;
}

// LibTorch's SM carve-out for its cuBLASLt GEMMs (Context::_setSMCarveout_EXPERIMENTAL, recent
// releases only; detected, not assumed): the GEMMs then target all but `sms` multiprocessors.
// Returns false where this LibTorch has none.
template <typename C = at::Context>
inline bool set_matmul_sm_carveout(std::optional<int32_t> sms, C& context = at::globalContext()) {
  if constexpr (detail::HasSmCarveout<C>::value) {
    context._setSMCarveout_EXPERIMENTAL(sms);
    return true;
  } else {
    (void)sms;
    (void)context;
    return false;
  }
}

// Which fused attention kernel SDPA prefers on the GPU, from ME_ATTENTION: "auto" (LibTorch's own
// order), "flash" (FlashAttention-2) or "cudnn" (cuDNN's fused attention, Hopper-tuned). Read once.
enum class AttentionBackend { automatic, flash, cudnn };
inline AttentionBackend attention_backend() {
  static const AttentionBackend backend = [] {
    const char* env = std::getenv("ME_ATTENTION");
    const std::string v = env ? env : "auto";
    if (v.empty() || v == "auto") return AttentionBackend::automatic;
    if (v == "flash") return AttentionBackend::flash;
    if (v == "cudnn") return AttentionBackend::cudnn;
    throw std::runtime_error("ME_ATTENTION='" + v + "': expected auto, flash or cudnn");
  }();
  return backend;
}
inline const char* attention_backend_name() {
  switch (attention_backend()) {
    case AttentionBackend::flash: return "flash";
    case AttentionBackend::cudnn: return "cudnn";
    default: return "auto";
  }
}

#if ME_TORCH_AT_LEAST(2, 6)
// Puts the chosen backend first in SDPA's priority order (the others stay as fallbacks).
inline void apply_attention_backend() {
  static const bool done = [] {
    using B = at::SDPBackend;
    std::vector<B> order;
    switch (attention_backend()) {
      case AttentionBackend::flash: order = {B::flash_attention, B::efficient_attention, B::cudnn_attention, B::math, B::overrideable}; break;
      case AttentionBackend::cudnn: order = {B::cudnn_attention, B::flash_attention, B::efficient_attention, B::math, B::overrideable}; break;
      default: return true;
    }
    std::vector<int64_t> ids;
    for (auto b : order) ids.push_back(static_cast<int64_t>(b));
    at::globalContext().setSDPPriorityOrder(ids);
    return true;
  }();
  (void)done;
}
#else
inline void apply_attention_backend() {}
#endif

#if ME_HAS_SDPA_GQA && ME_TORCH_HAS_CUDA
// Deterministic causal attention without FlashAttention's slower forward: cuDNN's fused forward
// (deterministic, about twice FlashAttention-2's speed on the H100) with its log-sum-exp, then
// FlashAttention-2's backward from that output and log-sum-exp (both natural-log [b, h, s] fp32
// statistics of the same scaled scores), which sums dq in a fixed order when LibTorch's
// deterministic algorithms are on. LibTorch itself never pairs them: it skips cuDNN whole in
// that mode, its backward having no deterministic path.
struct CudnnForwardFlashBackward : torch::autograd::Function<CudnnForwardFlashBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v) {
    auto r = at::_scaled_dot_product_cudnn_attention(q, k, v, /*attn_bias=*/{}, /*compute_log_sumexp=*/true,
                                                     /*dropout_p=*/0.0, /*is_causal=*/true, /*return_debug_mask=*/false);
    auto out = std::get<0>(r), lse = std::get<1>(r).reshape({q.size(0), q.size(1), q.size(2)});
    ctx->save_for_backward({q, k, v, out, lse, std::get<6>(r), std::get<7>(r)});
    return out;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto s = ctx->get_saved_variables();
    const torch::Tensor g = grads[0].stride(-1) == 1 ? grads[0] : grads[0].contiguous();  // the kernel's one layout demand
    auto r = at::_scaled_dot_product_flash_attention_backward(g, s[0], s[1], s[2], s[3], s[4], /*cum_seq_q=*/{},
                                                              /*cum_seq_k=*/{}, s[0].size(2), s[1].size(2),
                                                              /*dropout_p=*/0.0, /*is_causal=*/true, s[5], s[6]);
    return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
  }
};

// Whether the pair above serves q, k, v: deterministic algorithms on, one key/value head per
// query head, 16-bit, head_dim a multiple of 8 up to 128 (what both kernels take), and cuDNN's
// forward has not refused once already in this process.
inline std::atomic<bool>& cudnn_forward_refused() {
  static std::atomic<bool> refused{false};
  return refused;
}
inline bool use_cudnn_forward_flash_backward(const torch::Tensor& q, const torch::Tensor& k) {
  const auto d = q.size(-1);
  return at::globalContext().deterministicAlgorithms() && attention_backend() != AttentionBackend::cudnn &&
         q.size(1) == k.size(1) && (q.scalar_type() == torch::kBFloat16 || q.scalar_type() == torch::kHalf) &&
         d % 8 == 0 && d <= 128 && !cudnn_forward_refused().load();
}
#endif

// Causal self-attention over q [batch, heads, seq, head_dim] and k, v [batch, groups, seq,
// head_dim] (grouped-query attention when groups < heads: each key/value head serves
// heads / groups consecutive query heads). On 2.x this dispatches to the fused flash/efficient
// kernels; on 1.13 it is the textbook composition (same maths).
inline torch::Tensor causal_attention(const torch::Tensor& q, torch::Tensor k, torch::Tensor v) {
  const int64_t rep = q.size(1) / k.size(1);
#if ME_HAS_SDPA_GQA
  if (q.is_cuda()) {
    apply_attention_backend();
#if ME_TORCH_HAS_CUDA
    if (use_cudnn_forward_flash_backward(q, k)) {
      try {
        return CudnnForwardFlashBackward::apply(q, k, v);
      } catch (const c10::Error&) {
        cudnn_forward_refused() = true;  // e.g. a cuDNN without fused attention: FlashAttention's own forward
      }
    }
#endif
    // cuDNN's attention is not known to check grouped key/value heads: give it full ones.
    if (rep > 1 && attention_backend() == AttentionBackend::cudnn) {
      return at::scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), {}, 0.0,
                                              /*is_causal=*/true);
    }
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                            /*scale=*/c10::nullopt, /*enable_gqa=*/rep > 1);
  }
#endif
  if (rep > 1) {
    k = k.repeat_interleave(rep, 1);
    v = v.repeat_interleave(rep, 1);
  }
#if ME_HAS_SDPA
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true);
#else
  const auto seq = q.size(-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  auto mask = torch::ones({seq, seq}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v);
#endif
}

// AdamW over lists of fp32 tensors in one fused CUDA kernel (params, grads, m, v each read
// and written once); grads are divided by `grad_scale` inside it (gradient clipping at no extra
// pass). Returns false where LibTorch has no such kernel (1.13, CPU): the caller falls back to
// its multi-tensor composition.
inline bool fused_adamw(std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                        std::vector<torch::Tensor>& m, std::vector<torch::Tensor>& v, const torch::Tensor& step,
                        double lr, double beta1, double beta2, double weight_decay, double eps,
                        const torch::Tensor& grad_scale) {
#if ME_HAS_FUSED_ADAMW && ME_TORCH_HAS_CUDA
  if (params.empty() || !params.front().is_cuda()) return false;
  // The kernel reads each tensor's step count from its own entry: all share one tensor.
  std::vector<torch::Tensor> steps(params.size(), step);
  at::_fused_adamw_(params, grads, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2, weight_decay, eps,
                    /*amsgrad=*/false, /*maximize=*/false, grad_scale, /*found_inf=*/c10::nullopt);
  return true;
#else
  (void)params, (void)grads, (void)m, (void)v, (void)step, (void)lr, (void)beta1, (void)beta2, (void)weight_decay,
      (void)eps, (void)grad_scale;
  return false;
#endif
}

// out (+)= a @ b with out in fp32 and a, b possibly bf16: the weight-gradient GEMM of
// gradient-accumulation fusion. Since 2.8 cuBLAS writes (or adds into) the fp32 output itself
// (mm/addmm's out_dtype overloads, GPU only); elsewhere the product is formed in the inputs'
// dtype and then copied or added.
inline void matmul_into(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b, bool accumulate) {
  if (a.scalar_type() == out.scalar_type()) {
    if (accumulate) out.addmm_(a, b);
    else at::mm_out(out, a, b);
    return;
  }
#if ME_TORCH_AT_LEAST(2, 8)
  if (out.is_cuda()) {
    if (accumulate) at::addmm_out(out, out, a, b, out.scalar_type());
    else at::mm_out(out, a, b, out.scalar_type());
    return;
  }
#endif
  auto product = at::mm(a, b);
  if (accumulate) out.add_(product);
  else out.copy_(product);
}

// RMSNorm over the last dimension, statistics in fp32: x / sqrt(mean(x^2) + eps) * weight.
inline torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
#if ME_HAS_RMS_NORM
  if (x.is_cuda()) return at::rms_norm(x, {x.size(-1)}, weight, eps);
#endif
  auto xf = x.to(torch::kFloat);
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (y * weight.to(torch::kFloat)).to(x.scalar_type());
}

inline std::string torch_version() { return TORCH_VERSION; }

inline bool cuda_available() { return torch::cuda::is_available(); }

// The default generators' states, for checkpoints: the CPU's, and the current GPU's (undefined
// without CUDA). Each generator's own mutex guards it, as LibTorch's Python bindings do.
inline torch::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
inline void set_cpu_rng_state(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}
#if ME_TORCH_HAS_CUDA
inline torch::Tensor cuda_rng_state() {
  if (!cuda_available()) return {};
  auto gen = at::cuda::detail::getDefaultCUDAGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
inline void set_cuda_rng_state(const torch::Tensor& state) {
  auto gen = at::cuda::detail::getDefaultCUDAGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}
#else
inline torch::Tensor cuda_rng_state() { return {}; }
inline void set_cuda_rng_state(const torch::Tensor&) {}
#endif

// Waits for all work queued on the current GPU.
inline void cuda_synchronize() { torch::cuda::synchronize(); }
#if ME_TORCH_HAS_CUDA
// Starts capturing a CUDA graph (at::cuda::CUDAGraph) into memory pool `pool`. 2.x also takes the
// capture's error mode: thread-local, so that other threads' CUDA calls (NCCL's watchdog queries
// events) do not invalidate it; 1.13's captures always run in the global mode.
template <class Graph, class Pool>
void graph_capture_begin(Graph& graph, Pool pool) {
#if ME_TORCH_AT_LEAST(2, 0)
  graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
#else
  graph.capture_begin(pool);
#endif
}
#endif

// Returns the caching allocator's unused blocks to the driver (nothing without CUDA).
inline void cuda_empty_cache() {
#if ME_TORCH_HAS_CUDA
  if (cuda_available()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

// The caching allocator's bytes in use on the current GPU, now and at the peak since the
// last reset (0 without CUDA). Index 0 of the stat arrays is the aggregate over pools.
struct CudaMemory {
  int64_t allocated = 0, peak = 0;
};
inline CudaMemory cuda_memory() {
#if ME_TORCH_HAS_CUDA
  if (!cuda_available()) return {};
  // torch 2.x's allocator throws ("Invalid device argument") when asked before any CUDA tensor
  // was made: a CPU run in a CUDA build has no GPU memory to report.
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
    return {stats.allocated_bytes[0].current, stats.allocated_bytes[0].peak};
  } catch (const std::exception&) {
    return {};
  }
#else
  return {};
#endif
}
// The name of GPU `index` ("NVIDIA H100 80GB HBM3"); empty without CUDA.
inline std::string cuda_device_name(int index) {
#if ME_TORCH_HAS_CUDA
  cudaDeviceProp p{};
  if (cuda_available() && cudaGetDeviceProperties(&p, index) == cudaSuccess) return p.name;
#endif
  (void)index;
  return {};
}
inline void cuda_reset_peak_memory() {
#if ME_TORCH_HAS_CUDA
  if (cuda_available()) c10::cuda::CUDACachingAllocator::resetPeakStats(c10::cuda::current_device());
#endif
}

// A Kineto profiler event's start and duration: microseconds in 1.13, nanoseconds since 2.x
// (the microsecond accessors are gone there). A template, so no profiler header is needed here.
struct EventSpanNs {
  int64_t start, duration;
};
template <typename KinetoEvent>
EventSpanNs event_span_ns(const KinetoEvent& e) {
#if ME_TORCH_AT_LEAST(2, 4)
  return {static_cast<int64_t>(e.startNs()), static_cast<int64_t>(e.durationNs())};
#else
  return {static_cast<int64_t>(e.startUs()) * 1000, static_cast<int64_t>(e.durationUs()) * 1000};
#endif
}

// LibTorch >= 2.1 with deterministic algorithms on fills every new uninitialized tensor
// (torch::empty) with NaN, one more kernel per allocation; 1.13 has no such fill.
inline void set_deterministic_fill(bool on) {
#if ME_TORCH_AT_LEAST(2, 1)
  at::globalContext().setDeterministicFillUninitializedMemory(on);
#else
  (void)on;
#endif
}

}  // namespace me::compat
