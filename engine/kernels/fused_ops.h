// The CUDA kernels of engine/kernels as LibTorch operations: small autograd functions and a
// multi-tensor optimizer table. Callers ask use(op, tensor) first and keep their LibTorch
// composition for the other case: CPU tensors, builds without nvcc (the CPU machines), dtypes
// the kernels do not take, or the kernel switched off with ME_KERNELS (for A/B timing):
//   ME_KERNELS=all (default) | none | a comma list of swiglu, rotary, cross_entropy, adamw,
//   linear_bias, add_norm, gemm_gelu, chunk_gemm, wgrad_gemm
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

namespace me::kernels {

// rotary: the QKV split, with RoPE where the model has it. linear_bias and gemm_gelu are not
// kernels of ours but cuBLASLt GEMM epilogues (a linear layer's bias; GPT's GeLU), and chunk_gemm
// is the tensor-parallel chunks' GEMMs through cuBLASLt with kept plans; all switched like the
// others for A/B timing; so is wgrad_gemm, the weight gradients' GEMMs through cuBLASLt.
enum class Op { swiglu, rotary, cross_entropy, adamw, linear_bias, add_norm, gemm_gelu, chunk_gemm, wgrad_gemm };

// The kernels were compiled into this build (CMake found nvcc and LibTorch has CUDA).
bool compiled();
// The kernel for `op` will run on tensors like t: compiled, t on the GPU in fp32 or bf16, and
// not switched off by ME_KERNELS.
bool use(Op op, const torch::Tensor& t);
// "swiglu, rotary, cross_entropy, adamw" / "none (not compiled)" ...: for the run's log.
std::string describe();

// SwiGLU on the fused gate/up projection: gate_up [..., 2f] holds (gate, up) pairs interleaved;
// returns silu(gate) * up [..., f]. Saves only gate_up for backward.
torch::Tensor swiglu(const torch::Tensor& gate_up);

// The fused QKV projection [b, s, groups * (rep + 2) * d] split into q [b, heads, s, d] and
// k, v [b, groups, s, d], q and k rotated when RoPE tables are given (fp32 cos_half, sin_half
// [max_seq, d/2] on the device; undefined: no rotation), in one autograd function: backward
// writes the QKV gradient once instead of summing three zero-padded ones (LibTorch's narrow and
// select backward), and the rotation costs no temporaries.
struct QKV {
  torch::Tensor q, k, v;
};
QKV split_qkv(const torch::Tensor& qkv, int64_t groups, int64_t rep, int64_t head_dim,
              const torch::Tensor& cos_half = {}, const torch::Tensor& sin_half = {});

// Residual add + LayerNorm (rms false: weight and bias) or RMSNorm (weight only) in one pass
// each way: sum = x + delta, y = norm(sum). add_norm_fits: the kernel takes these tensors
// (x and delta of one shape, dtype and device, weight and bias (may be undefined) in that dtype,
// a hidden size it supports).
struct AddNorm {
  torch::Tensor sum, y;
};
bool add_norm_fits(const torch::Tensor& x, const torch::Tensor& delta, const torch::Tensor& weight,
                   const torch::Tensor& bias);
AddNorm add_norm(const torch::Tensor& x, const torch::Tensor& delta, const torch::Tensor& weight,
                 const torch::Tensor& bias, double eps, bool rms);

// GPT's MLP GeLU inside cuBLASLt's GEMM epilogues (kernels.h gemm_bias_gelu / gemm_dgelu). No
// autograd here: parallel::linear_gelu / gelu_linear wrap them with the layers' gradients.
// gemm_gelu_fits: x [..., in] and w [out, in] bf16 on the GPU, in and out multiples of 8.
// linear_gelu: {pre, out} = {x w^T + b, gelu(pre)} ([..., out]; b may be undefined).
// matmul_dgelu: (grad_out w) * gelu'(pre), grad_out [..., out], pre [..., in].
// Both give undefined tensors when cuBLASLt offers no kernel (the caller composes instead).
// `into`: contiguous outputs of the right shape to write instead of new ones (row slices of a
// larger result, for the chunked GEMMs of parallel/collective_matmul.h).
struct Activated {
  torch::Tensor pre, out;
};
bool gemm_gelu_fits(const torch::Tensor& x, const torch::Tensor& w);

// chunk_gemm: the tensor-parallel layers' row-chunk GEMMs through cuBLASLt with kept plans
// (kernels.h gemm_linear / gemm_input_grad), into rows of an existing output. x2, dy2 and into
// are 2-D with unit stride along rows (narrowed row ranges of larger tensors are fine), w
// contiguous [out, in], b contiguous [out] or undefined, all bf16 on the GPU with 16-byte rows.
// Returns false, writing nothing, where they do not apply: the caller runs LibTorch's mm.
// linear_rows_into: into = x2 w^T (+ b). input_grad_rows_into: into = dy2 w.
bool linear_rows_into(const torch::Tensor& x2, const torch::Tensor& w, const torch::Tensor& b, const torch::Tensor& into);
bool input_grad_rows_into(const torch::Tensor& dy2, const torch::Tensor& w, const torch::Tensor& into);
void set_gemm_sm_count_target(int sms);  // kernels.h's; a no-op without the CUDA kernels
// wgrad_gemm: main (+)= dy2^T x2, a weight gradient into its main grad (kernels.h
// gemm_weight_grad: LibTorch's addmm takes the same kernel; through cuBLASLt, ME_GEMM_AUTOTUNE=1
// can time its candidates). dy2 [rows, out] and x2 [rows, in] as chunk_gemm's operands, main
// contiguous [out, in] in f32 or bf16 on their GPU. False, writing nothing, where it does not apply.
bool weight_grad_into(const torch::Tensor& main, const torch::Tensor& dy2, const torch::Tensor& x2, bool accumulate);
// kernels.h's; empty (0) without the CUDA kernels.
std::string gemm_autotune_summary();
size_t gemm_autotune_settled();
Activated linear_gelu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                      const Activated& into = {});
torch::Tensor matmul_dgelu(const torch::Tensor& grad_out, const torch::Tensor& w, const torch::Tensor& pre,
                           const torch::Tensor& into = {});

// Cross entropy pieces over a vocabulary shard of logits [rows, vocab] (see kernels.h).
struct RowStats {
  torch::Tensor max, sum_exp, target;  // fp32 [rows]
};
// `real`: how many leading columns are real tokens (the rest is vocabulary padding, -inf).
RowStats cross_entropy_stats(const torch::Tensor& logits, const torch::Tensor& labels, int64_t vocab_start,
                             int64_t real);
// logits becomes the gradient, in place: (softmax - one_hot) * grad_row, 0 on the padding.
void cross_entropy_backward_(torch::Tensor& logits, const torch::Tensor& labels, int64_t vocab_start, int64_t real,
                             const torch::Tensor& lse, const torch::Tensor& grad_row);

// AdamW and the fp64 gradient sum of squares over many fp32 tensors in a few launches. The
// tensors' storage must outlive this object (its device table holds their addresses).
class MultiTensorAdamW {
 public:
  struct Entry {
    torch::Tensor master, grad, exp_avg, exp_avg_sq;  // fp32; grad fp32 or bf16
    torch::Tensor model;  // bf16 parameter refreshed from the master after the update, or undefined
    double weight_decay = 0;
    bool in_norm = true;
  };
  explicit MultiTensorAdamW(const std::vector<Entry>& entries);
  // Sum over in_norm entries of grad^2: an fp64 scalar tensor on the device (no sync).
  torch::Tensor grad_sum_squares();
  // One AdamW step (step counts from 1), gradients multiplied by grad_scale first.
  void step(double lr, double beta1, double beta2, double eps, int64_t step, double grad_scale);

 private:
  torch::Tensor table_, chunks_, partials_, out_;
  int64_t num_chunks_ = 0;
};

}  // namespace me::kernels
