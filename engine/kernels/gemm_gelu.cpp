// GeLU inside cuBLASLt's GEMM epilogues (see kernels.h): GPT's fc1 GEMM writes both its output
// and gelu(output), and the fc2 input-gradient GEMM multiplies by gelu'(pre-activation) as it
// writes, so the two elementwise passes over the [tokens, 4h] activations (and their reads of
// what the GEMM just wrote) disappear. Host code only: no kernel of ours, cuBLASLt's kernels.
//
// Row-major tensors are column-major transposes, so a row-major C = A B is computed as the
// column-major C^T = B^T A^T: the operands swap places and the dimensions read backwards.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "engine/kernels/kernels.h"

namespace me::kernels {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what cuBLAS itself gives Hopper GEMMs

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLASLt ") + what + " failed: status " + std::to_string(int(s)));
}

// One column-major GEMM D[m, n] = op(A) op(B) with an epilogue; A stored [m, k] (op N) or [k, m]
// (op T), B stored [k, n], all bf16 with fp32 accumulation.
struct Gemm {
  bool transpose_a;
  int64_t m, n, k;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  void* d;
  int64_t ldd;
  cublasLtEpilogue_t epilogue;
  const void* bias;  // length m, or null
  void* aux;         // [m, n], leading dimension ldd
};

// The largest power of two up to 256 dividing the address: cuBLASLt's kernels depend on it.
uint32_t alignment(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

using Key = std::array<int64_t, 15>;

// Multiprocessors this thread's GEMMs target (0: all), see set_gemm_sm_count_target.
thread_local int sm_count_target = 0;

struct Context {
  cublasLtHandle_t handle = nullptr;
  std::mutex mutex;
  std::map<std::pair<int, cudaStream_t>, void*> workspaces;  // per device and stream: never shared by two streams
  std::map<Key, std::pair<bool, cublasLtMatmulAlgo_t>> algos;  // the heuristic's first choice (or none) per shape
};

// Made once and never destroyed: tearing it down at exit could run after the CUDA runtime's own.
Context& context() {
  static Context* c = [] {
    auto* ctx = new Context;
    check(cublasLtCreate(&ctx->handle), "handle creation");
    return ctx;
  }();
  return *c;
}

// RAII for the descriptors of one call.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  check(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), "descriptor attribute");
}

bool run(const Gemm& g, cudaStream_t stream) {
  Context& ctx = context();
  Descriptors desc;
  check(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor creation");
  const cublasOperation_t ta = g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  set(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  set(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
  if (g.bias) set(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (sm_count_target > 0) set(desc.op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, int32_t{sm_count_target});
  set(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
  set(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ldd);
  check(cublasLtMatrixLayoutCreate(&desc.a, CUDA_R_16BF, g.transpose_a ? g.k : g.m, g.transpose_a ? g.m : g.k, g.lda),
        "layout A");
  check(cublasLtMatrixLayoutCreate(&desc.b, CUDA_R_16BF, g.k, g.n, g.ldb), "layout B");
  check(cublasLtMatrixLayoutCreate(&desc.d, CUDA_R_16BF, g.m, g.n, g.ldd), "layout D");

  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) throw std::runtime_error("cuBLASLt GEMM: no current CUDA device");
  const uint32_t align_a = alignment(g.a), align_b = alignment(g.b), align_d = alignment(g.d),
                 align_x = std::min(alignment(g.aux), g.bias ? alignment(g.bias) : 256u);
  const Key key{device, g.transpose_a, g.m, g.n, g.k, g.lda, g.ldb, g.ldd, int64_t(g.epilogue), g.bias != nullptr,
                align_a, align_b, align_d, align_x, sm_count_target};
  std::pair<bool, cublasLtMatmulAlgo_t> algo{};
  void* workspace = nullptr;
  {
    std::lock_guard<std::mutex> lock(ctx.mutex);
    auto& ws = ctx.workspaces[{device, stream}];
    if (!ws && cudaMalloc(&ws, kWorkspaceBytes) != cudaSuccess) {
      ws = nullptr;
      throw std::runtime_error("cuBLASLt GEMM: cannot allocate its 32 MiB workspace");
    }
    workspace = ws;
    auto it = ctx.algos.find(key);
    if (it == ctx.algos.end()) {
      check(cublasLtMatmulPreferenceCreate(&desc.pref), "preference creation");
      const uint64_t bytes = kWorkspaceBytes;
      check(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                                                 sizeof(bytes)),
            "preference");
      for (auto [attr, value] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
                                 std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
                                 std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
                                 std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}})
        check(cublasLtMatmulPreferenceSetAttribute(desc.pref, attr, &value, sizeof(value)), "preference");
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(ctx.handle, desc.op, desc.a, desc.b, desc.d, desc.d,
                                                              desc.pref, 1, &result, &found);
      const bool ok = s == CUBLAS_STATUS_SUCCESS && found > 0;
      it = ctx.algos.emplace(key, std::pair{ok, result.algo}).first;
    }
    algo = it->second;
  }
  if (!algo.first) return false;  // no kernel for this epilogue and shape: the caller composes
  const float alpha = 1.f, beta = 0.f;
  check(cublasLtMatmul(ctx.handle, desc.op, &alpha, g.a, desc.a, g.b, desc.b, &beta, g.d, desc.d, g.d, desc.d,
                       &algo.second, workspace, kWorkspaceBytes, stream),
        "matmul");
  return true;
}

}  // namespace

void set_gemm_sm_count_target(int sms) { sm_count_target = sms > 0 ? sms : 0; }

bool gemm_gelu_supported(int64_t in_features, int64_t out_features) {
  // 16-byte rows for every operand (bf16: multiples of 8), as the epilogue's aux matrix needs.
  return in_features > 0 && out_features > 0 && in_features % 8 == 0 && out_features % 8 == 0;
}

bool gemm_bias_gelu(const void* x, const void* w, const void* bias, void* pre, void* out, int64_t rows,
                    int64_t in_features, int64_t out_features, void* stream) {
  if (!gemm_gelu_supported(in_features, out_features) || rows <= 0) return false;
  // Row-major out[rows, out_f] = x[rows, in] w[out_f, in]^T is column-major out^T = w x^T:
  // A = w (stored [in, out_f] column-major, transposed), B = x^T (stored [in, rows]).
  const Gemm g{true,  out_features, rows, in_features, w,   in_features,
               x,     in_features,  out, out_features, bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX,
               bias,  pre};
  return run(g, static_cast<cudaStream_t>(stream));
}

bool gemm_dgelu(const void* grad_out, const void* w, const void* pre, void* grad_pre, int64_t rows,
                int64_t out_features, int64_t in_features, void* stream) {
  if (!gemm_gelu_supported(in_features, out_features) || rows <= 0) return false;
  // Row-major grad_pre[rows, in] = grad_out[rows, out_f] w[out_f, in]: column-major
  // grad_pre^T = w^T grad_out^T, A = w^T (stored [in, out_f]), B = grad_out^T (stored [out_f, rows]).
  const Gemm g{false, in_features, rows, out_features, w, in_features, grad_out, out_features, grad_pre, in_features,
               CUBLASLT_EPILOGUE_DGELU, nullptr, const_cast<void*>(pre)};
  return run(g, static_cast<cudaStream_t>(stream));
}

}  // namespace me::kernels
