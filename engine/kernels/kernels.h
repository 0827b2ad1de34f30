// megaengine's own CUDA kernels, behind a torch-free interface: raw device pointers, element
// counts, and the CUDA stream passed as void* (a cudaStream_t). The .cu files include only
// this header and the CUDA runtime, so nvcc compiles them in seconds and CI can compile them
// on a machine without a GPU. engine/kernels/fused_ops.h wraps them as autograd functions.
//
// Every kernel computes in fp32 whatever the storage type, and each has a check against a CPU
// reference plus a micro-benchmark in dev/cuda/, and a GPU test against the LibTorch
// composition it replaces (tests/unit/test_kernels.cpp). Errors (a failed launch) are thrown
// as std::runtime_error naming the kernel.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace me::kernels {

enum class DType : int32_t { f32 = 0, bf16 = 1 };

// --- SwiGLU over row-interleaved pairs -------------------------------------------------------
// gate_up holds n (gate, up) pairs back to back: [g0, u0, g1, u1, ...] (the fused gate/up
// projection's layout). out[i] = silu(g_i) * u_i.
void swiglu_forward(DType t, const void* gate_up, void* out, int64_t n, void* stream);
// grad_gate_up[2i] = dy_i * u_i * silu'(g_i), grad_gate_up[2i + 1] = dy_i * silu(g_i).
void swiglu_backward(DType t, const void* gate_up, const void* grad_out, void* grad_gate_up, int64_t n,
                     void* stream);

// --- Sum of partial results (the copy engines' reduce-scatter) --------------------------------
// out[i] = first[i] + parts[0][i] + parts[1][i] + ... for i < n, each addition rounded to the
// storage type as a separate add_ rounds it (the same bits as count add_ calls in that order on
// a copy of first), in one pass. out may be first (in place).
constexpr int kMaxSumParts = 7;  // tp 8: the seven peers' pushes
// With `bias` ([cols], the same dtype; n a multiple of cols): then + bias[i % cols], rounded as
// well (the bits of a following add_ of the broadcast bias: a row-parallel layer's).
void sum_parts(DType t, void* out, const void* first, const void* const* parts, int count, int64_t n, void* stream,
               const void* bias = nullptr, int64_t cols = 0);

// --- One read, two writes (the copy engines' all-gather) --------------------------------------
// a[0, bytes) = b[0, bytes) = src[0, bytes): this rank's rows into its slot and into the gathered
// result, read once. a, b and src do not overlap; any alignment (unaligned: two copies).
void copy_twice(void* a, void* b, const void* src, size_t bytes, void* stream);

// --- Rotary position embedding ("rotate half") -----------------------------------------------
// Rows of head_dim elements addressed by (batch, position, group, rep) with element strides,
// the last dimension contiguous: heads are split as (group, rep) so queries can be read straight
// out of the fused QKV layout [b, s, groups, rep + 2, d] (keys: rep = 1). Element i < d/2 pairs
// with i + d/2:
//   y_i = x_i cos - x_{i+d/2} sin,   y_{i+d/2} = x_{i+d/2} cos + x_i sin
// with cos, sin = cos_half[pos, i], sin_half[pos, i] (fp32 tables [max_seq, d/2]).
// inverse = true rotates by -angle: the backward pass (the rotation's transpose). Null tables:
// no rotation (a strided copy: the QKV split of models without RoPE).
struct RowLayout {
  int64_t batch, seq, groups, rep;
  int64_t stride_batch, stride_seq, stride_group, stride_rep;
};
void rotary(DType t, const void* x, const RowLayout& in, void* y, const RowLayout& out, int64_t head_dim,
            const float* cos_half, const float* sin_half, bool inverse, void* stream);

// --- Cross entropy over (a vocabulary shard of) logits [rows, vocab], row-major --------------
// Per row, one pass over the logits: the row's max, sum(exp(x - max)), and the logit of
// labels[row] - vocab_start when that falls inside [0, vocab), else 0. The caller combines
// shards (tensor parallelism) and forms loss = log(sum) + max - target. Columns from `real` on
// (0 <= real <= vocab; < 0: none) are vocabulary padding, taken as -inf.
void cross_entropy_stats(DType t, const void* logits, int64_t rows, int64_t vocab, int64_t real,
                         const int64_t* labels, int64_t vocab_start, float* row_max, float* row_sum_exp, float* target,
                         void* stream);
// grad[r, j] = (exp(x[r, j] - lse[r]) - [j == labels[r] - vocab_start]) * grad_row[r], 0 for
// the padding columns from `real` on. grad may be logits itself (in place: the [tokens, vocab]
// gradient is the step's largest tensor).
void cross_entropy_backward(DType t, const void* logits, void* grad, int64_t rows, int64_t vocab, int64_t real,
                            const int64_t* labels, int64_t vocab_start, const float* lse, const float* grad_row,
                            void* stream);

// --- Residual add + LayerNorm / RMSNorm over rows [rows, hidden], row-major -------------------
// sum = x + delta (rounded to the storage type, as a separate bf16 add would), then
// y = (sum - mean) * rstd * weight + bias      (LayerNorm; rms = false)
// y = sum * rstd * weight                       (RMSNorm; rms = true, mean not used)
// with statistics in fp32 over the rounded sum. delta null: no add (sum_out not written; the
// statistics are of x). bias may be null. weight/bias have the storage type of x.
// mean (LayerNorm only) and rstd: fp32 [rows], saved for backward.
// Both directions: an output may be one of the streamed inputs (in place, element for element).
bool add_norm_supported(int64_t hidden);  // 1 <= hidden <= 16384 (16-byte vectors where hidden and pointers allow)
void add_norm_forward(DType t, bool rms, const void* x, const void* delta, const void* weight, const void* bias,
                      void* sum_out, void* y, float* mean, float* rstd, int64_t rows, int64_t hidden, float eps,
                      void* stream);
// Backward. grad_y: gradient of y; grad_sum: gradient reaching `sum` from elsewhere (the
// residual path), may be null. input: the tensor that was normalised (sum, or x without delta).
// grad_in = grad_sum + d norm / d input (one rounding): the gradient of both x and delta.
// grad_weight, grad_bias: fp32 [hidden], overwritten (grad_bias may be null: RMSNorm / no bias).
// scratch: add_norm_scratch_floats(rows, hidden) floats of device memory (per-block partial sums;
// the count depends on the current device's SM count). rows == 0 launches nothing, in either
// direction (grad_weight / grad_bias are then not written).
// passes: one fused pass (each block's partial column sums kept beside its rows), or two (the
// rows, then the column sums by columns: fewer bytes where rows are wide and few); automatic picks
// by width and rows (add_norm_backward_two_pass, measured on an H100). Both are deterministic;
// they differ in the order of the column sums' additions.
int64_t add_norm_scratch_floats(int64_t rows, int64_t hidden);
enum class NormBackwardPasses { automatic, one, two };
bool add_norm_backward_two_pass(DType t, int64_t rows, int64_t hidden);
void add_norm_backward(DType t, bool rms, const void* grad_y, const void* grad_sum, const void* input,
                       const float* mean, const float* rstd, const void* weight, void* grad_in, float* grad_weight,
                       float* grad_bias, float* scratch, int64_t rows, int64_t hidden, void* stream,
                       NormBackwardPasses passes = NormBackwardPasses::automatic);

// --- GEMMs with GeLU in cuBLASLt's epilogue (cublaslt_gemm.cpp; no kernel of ours) -------------
// bf16, row-major, fp32 accumulation; GeLU is the tanh approximation (GPT-2's, Megatron's).
// Forward of a linear layer followed by GeLU: x [rows, in], w [out, in], bias [out] or null:
//   pre = x w^T + bias,  out = gelu(pre)                      (both [rows, out], one GEMM)
// Backward through GeLU and the next linear layer: grad_out [rows, out], w [out, in] (that
// layer's weight), pre [rows, in] (the GeLU's input, as saved above):
//   grad_pre = (grad_out w) * gelu'(pre)                     ([rows, in], one GEMM)
// Both return false when cuBLASLt offers no kernel for the shape (the caller composes instead).
// A 32 MiB workspace per device and stream is allocated on first use and kept.
bool gemm_gelu_supported(int64_t in_features, int64_t out_features);  // both multiples of 8
// The multiprocessors this thread's GeLU GEMMs target from now on (0: all; cuBLASLt's
// SM_COUNT_TARGET), to leave room for a collective running beside them.
void set_gemm_sm_count_target(int sms);
// Allocates the current device's workspace for `stream` now, if it has none: a stream that will
// capture a CUDA graph (model/block_graphs.h), inside which cudaMalloc is not allowed.
void reserve_gemm_workspace(void* stream);
bool gemm_bias_gelu(const void* x, const void* w, const void* bias, void* pre, void* out, int64_t rows,
                    int64_t in_features, int64_t out_features, void* stream);
bool gemm_dgelu(const void* grad_out, const void* w, const void* pre, void* grad_pre, int64_t rows,
                int64_t out_features, int64_t in_features, void* stream);

// bf16 row-major GEMMs through cuBLASLt with each shape's plan kept (host: one cublasLtMatmul),
// for the tensor-parallel chunks' GEMMs, whose host time paces tp 4 (LibTorch's mm costs the host
// several times more per call: the narrow, the output's allocation, the dispatch). Rows of every
// matrix have unit stride and a leading dimension (ld) in elements; false: no kernel for the
// shape (the caller composes).
// gemm_linear: out[rows, out_f] = x[rows, in] w[out_f, in]^T (+ bias[out_f]).
bool gemm_linear(const void* x, int64_t ld_x, const void* w, const void* bias, void* out, int64_t ld_out, int64_t rows,
                 int64_t in_features, int64_t out_features, void* stream);
// gemm_input_grad: out[rows, in] = dy[rows, out_f] w[out_f, in].
bool gemm_input_grad(const void* dy, int64_t ld_dy, const void* w, void* out, int64_t ld_out, int64_t rows,
                     int64_t out_features, int64_t in_features, void* stream);
// gemm_weight_grad: main[out_f, in] = dy[rows, out_f]^T x[rows, in], or += where accumulate;
// main contiguous in f32 or bf16 (a main grad), dy and x bf16.
bool gemm_weight_grad(const void* dy, int64_t ld_dy, const void* x, int64_t ld_x, void* main, DType main_type,
                      int64_t rows, int64_t out_features, int64_t in_features, bool accumulate, void* stream);
// What the trials in the step chose (cublaslt_gemm.cpp, gemm_trial.h: with ME_GEMM_AUTOTUNE=1 each
// shape's candidates are tried in its first calls): "N shapes' candidates timed in the step ...,
// M faster than the heuristic's first choice: ... ms", or empty while none has settled; and how
// many have settled. Neither touches the GPU.
std::string gemm_autotune_summary();
size_t gemm_autotune_settled();

// --- fp8 casts for Hopper's fp8 GEMMs (fp8_cast.cu) -------------------------------------------
// E4M3 (max 448; weights and activations) and E5M2 (max 57344; gradients), as cuda_fp8.h's
// __nv_fp8_e4m3 / __nv_fp8_e5m2 with saturation to the largest finite value (NaN stays NaN).
enum class Fp8 : int32_t { e4m3 = 0, e5m2 = 1 };
inline float fp8_max(Fp8 f) { return f == Fp8::e4m3 ? 448.f : 57344.f; }
// One pass over x [rows, cols] (row-major, bf16 or f32): out = fp8(x * scale[0]) row-major, and,
// when out_t is not null, the same values transposed ([cols, rows], row-major: the K-major
// operand cuBLASLt's fp8 GEMMs need for the weight and input gradients); amax[0] = max(amax[0],
// max |x|) (for the scale of later steps: delayed scaling); scale_inv[0] = 1 / scale[0] when
// scale_inv is not null (what the GEMM multiplies back, fixed with this cast while the scale
// moves on). scale, amax and scale_inv are device fp32. Rows and columns of any size (fastest
// when both are multiples of 64). With gelu, what is cast (and its amax) is gelu(x), tanh
// approximation as torch::gelu(x, "tanh"), in float32: GPT's MLP casts its second layer's input
// straight from the first layer's output, and gelu(x) is never written in bf16.
void fp8_cast_transpose(DType t, Fp8 f, const void* x, int64_t rows, int64_t cols, const float* scale, uint8_t* out,
                        uint8_t* out_t, float* amax, float* scale_inv, void* stream, bool gelu = false);
// A delayed scale's update after a cast (fp8_scaling.h), one launch: history[next] = amax[0],
// amax[0] = 0, and scale[0] = top / max(history) where that maximum is positive and finite (else
// the scale stays). history has `length` device fp32 entries.
void fp8_delayed_scale_update(float* history, int64_t length, int64_t next, float* amax, float* scale, float top,
                              void* stream);

// --- fp8 GEMMs (cublaslt_gemm.cpp; cuBLASLt's kernels) ------------------------------------------
// An fp8 matrix, row-major, and the device fp32 scalar it is multiplied by in the GEMM (1 / the
// scale it was cast with).
struct Fp8Operand {
  const void* data;
  Fp8 format;
  const float* scale;
};
// d[rows, cols] = (a[rows, k] b[cols, k]^T) * a.scale * b.scale (+ bias[cols], bf16), fp32
// accumulation, d bf16 or f32; accumulate: d += the product (then no bias). Not both E5M2.
// fast_accum: Hopper's faster accumulation (Transformer Engine's choice for the forward).
// Returns false where cuBLASLt offers no kernel (the caller composes another way).
bool gemm_fp8_supported(int64_t rows, int64_t cols, int64_t k);  // all three multiples of 16
bool gemm_fp8(const Fp8Operand& a, const Fp8Operand& b, const void* bias, DType d_type, void* d, int64_t rows,
              int64_t cols, int64_t k, bool accumulate, bool fast_accum, void* stream);

// --- Multi-tensor optimizer kernels ----------------------------------------------------------
// One launch over every parameter: a table of tensors (device memory, built once: the
// pointers never move) cut into fixed-size chunks, one thread block per chunk.
struct OptimTensor {
  float* master;           // fp32 master weights (updated in place)
  const void* grad;        // fp32 gradients, or bf16 ones (grad_bf16: parallel.grad_reduce_dtype = "bf16")
  float* exp_avg;          // AdamW moments
  float* exp_avg_sq;
  uint16_t* model_bf16;    // the model's bf16 copy to refresh after the update, or null
  int64_t numel;
  float weight_decay;
  int32_t in_norm;         // counted in the gradient norm (TP-replicated params on one rank only)
  int32_t grad_bf16;       // grad points to bf16 values
};
struct OptimChunk {
  int32_t tensor;
  int32_t pad;
  int64_t start;
};
constexpr int64_t kOptimChunkElems = int64_t{1} << 16;
std::vector<OptimChunk> make_chunks(const std::vector<OptimTensor>& tensors);

// out[0] = sum over in_norm tensors of grad^2, accumulated in fp64 and in a fixed order (the
// same gradients give the same bits). partials: one double per chunk (scratch).
void grad_sum_squares(const OptimTensor* tensors, const OptimChunk* chunks, int64_t num_chunks, double* partials,
                      double* out, void* stream);

struct AdamWStep {
  float lr, beta1, beta2, eps;
  float bias_correction1;       // 1 - beta1^step
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  float grad_scale;             // multiplies the gradients (clipping)
};
// Decoupled-decay AdamW as torch.optim.AdamW computes it, then the bf16 model copy written from
// the new master (no separate write-back pass).
void adamw(const OptimTensor* tensors, const OptimChunk* chunks, int64_t num_chunks, const AdamWStep& step,
           void* stream);

}  // namespace me::kernels
