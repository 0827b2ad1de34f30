// GEMMs through cuBLASLt where LibTorch's do not reach (see kernels.h), host code only: cuBLASLt's
// kernels, no kernel of ours.
// - GeLU inside the epilogues: GPT's fc1 GEMM writes both its output and gelu(output), and the
//   fc2 input-gradient GEMM multiplies by gelu'(pre-activation) as it writes, so the two
//   elementwise passes over the [tokens, 4h] activations (and their reads of what the GEMM just
//   wrote) disappear.
// - fp8 (precision = "fp8"): E4M3/E5M2 operands with per-tensor scales, the output in bf16 or
//   added into an fp32 main gradient (beta = 1: at::_scaled_mm has no accumulating form, and a
//   separate add would read and write the fp32 gradient once more per micro-batch).
// - weight gradients (gemm_weight_grad): dw (+)= dy^T x into the fp32 (or bf16) main grad.
// Each shape's descriptors and algorithm are made on its first call and kept (per thread), so a
// call costs the host one cublasLtMatmul and the pointer attributes (at tp 4 the step waits for
// the slowest rank's host: bench/RESULTS.md, nineteenth and twentieth sessions).
// The algorithm is the heuristic's first candidate, or with ME_GEMM_AUTOTUNE=1 the fastest of its
// candidates as the step's own calls run them (gemm_trial.h). Timed alone, before the first call,
// the first choice ran 5-14% slower than the best candidate for the weight gradients at the GPT-39B
// width, and the choice made that width's tp 1 layer 1.2-1.4% faster, but the LLaMA-2-70B width's
// 0.7% slower (bench/RESULTS.md, thirty-fifth session): hence the timing in the step, and opt-in
// until measured there. train.deterministic refuses it (timings vary from run to run, and the
// rounding would with them). What it chose is in gemm_autotune_summary().
//
// Row-major tensors are column-major transposes, so a row-major C = A B is computed as the
// column-major C^T = B^T A^T: the operands swap places and the dimensions read backwards.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/kernels/gemm_trial.h"
#include "engine/kernels/kernels.h"

namespace me::kernels {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what cuBLAS itself gives Hopper GEMMs
constexpr int kCandidates = 8;  // the heuristic's; it offered 8 for every shape of dev/cuda/gemm_algos

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLASLt ") + what + " failed: status " + std::to_string(int(s)));
}

// One column-major GEMM D[m, n] (+)= op(A) op(B) with an epilogue; A stored [m, k] (op N) or
// [k, m] (op T), B stored [k, n], fp32 accumulation. bf16 unless the types say otherwise.
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
  cudaDataType_t a_type = CUDA_R_16BF, b_type = CUDA_R_16BF, d_type = CUDA_R_16BF;
  const float* a_scale = nullptr;  // fp8 operands: device scalars each operand is multiplied by
  const float* b_scale = nullptr;
  bool accumulate = false;  // D += op(A) op(B) (beta = 1)
  bool fast_accum = false;  // fp8: Hopper's faster, less precise accumulation
  bool transpose_b = false;  // B stored [n, k] (op T) instead of [k, n]
};

// The largest power of two up to 256 dividing the address: cuBLASLt's kernels depend on it.
uint32_t alignment(const void* p) {
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

using Key = std::array<int64_t, 21>;

// Multiprocessors this thread's GEMMs target (0: all), see set_gemm_sm_count_target.
thread_local int sm_count_target = 0;

// One plan's trial, once settled, for gemm_autotune_summary().
struct Tuned {
  int64_t m, n, k;
  int candidates, chosen;
  float first_ms, chosen_ms;
};

// The settled trials, kept apart from the handle: reading them must not make a CUDA context.
struct TunedList {
  std::mutex mutex;
  std::vector<Tuned> settled;
};
TunedList& tuned_list() {
  static TunedList* list = new TunedList;  // never destroyed, as context()
  return *list;
}

struct Context {
  cublasLtHandle_t handle = nullptr;
  std::mutex mutex;
  std::map<std::pair<int, cudaStream_t>, void*> workspaces;  // per device and stream: never shared by two streams
};

// The workspace of (device, stream), allocated on first use.
void* workspace_of(Context& ctx, int device, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(ctx.mutex);
  auto& ws = ctx.workspaces[{device, stream}];
  if (!ws && cudaMalloc(&ws, kWorkspaceBytes) != cudaSuccess) {
    ws = nullptr;
    throw std::runtime_error("cuBLASLt GEMM: cannot allocate its 32 MiB workspace");
  }
  return ws;
}

// Made once and never destroyed: tearing it down at exit could run after the CUDA runtime's own.
Context& context() {
  static Context* c = [] {
    auto* ctx = new Context;
    check(cublasLtCreate(&ctx->handle), "handle creation");
    return ctx;
  }();
  return *c;
}

// The descriptors of one shape, with the heuristic's candidate algorithms for it (or none), made
// on its first call and kept: later calls only set the pointers that change.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, its first choice first (none: no kernel)
  int chosen = 0;                                // what the calls take
  std::unique_ptr<GemmTrial> trial;              // ME_GEMM_AUTOTUNE=1, until it settles
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
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

bool autotune_on() {
  const char* v = std::getenv("ME_GEMM_AUTOTUNE");
  return v && std::string(v) == "1";
}

// A new plan for g's shape (the key): descriptors, then the heuristic's candidates, to be tried in
// the step where timing is asked for (ME_GEMM_AUTOTUNE=1).
std::unique_ptr<Plan> make_plan(const Gemm& g, Context& ctx, const std::array<uint32_t, 3>& align) {
  auto plan = std::make_unique<Plan>();
  check(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor creation");
  const cublasOperation_t ta = g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  set(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
  // The pointers are set on every call; these make the heuristic see what the calls will have.
  if (g.bias) set(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (sm_count_target > 0) set(plan->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, int32_t{sm_count_target});
  if (g.aux) {
    set(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
    set(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ldd);
  }
  if (g.a_scale) set(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.a_scale);
  if (g.b_scale) set(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.b_scale);
  if (g.fast_accum) set(plan->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{1});
  check(cublasLtMatrixLayoutCreate(&plan->a, g.a_type, g.transpose_a ? g.k : g.m, g.transpose_a ? g.m : g.k, g.lda),
        "layout A");
  check(cublasLtMatrixLayoutCreate(&plan->b, g.b_type, g.transpose_b ? g.n : g.k, g.transpose_b ? g.k : g.n, g.ldb),
        "layout B");
  check(cublasLtMatrixLayoutCreate(&plan->d, g.d_type, g.m, g.n, g.ldd), "layout D");
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "preference creation");
  const uint64_t bytes = kWorkspaceBytes;
  cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                                                          sizeof(bytes));
  for (auto [attr, value] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]},
                             std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]},
                             std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]},
                             std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]}})
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
  std::vector<cublasLtMatmulHeuristicResult_t> results(kCandidates);
  int found = 0;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulAlgoGetHeuristic(ctx.handle, plan->op, plan->a, plan->b, plan->d, plan->d, pref, kCandidates,
                                       results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  for (int i = 0; s == CUBLAS_STATUS_SUCCESS && i < found; ++i)
    if (results[size_t(i)].state == CUBLAS_STATUS_SUCCESS) plan->candidates.push_back(results[size_t(i)].algo);
  if (const int n = int(plan->candidates.size()); n > 1 && autotune_on()) plan->trial = std::make_unique<GemmTrial>(n);
  return plan;
}

bool run(const Gemm& g, cudaStream_t stream) {
  Context& ctx = context();
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) throw std::runtime_error("cuBLASLt GEMM: no current CUDA device");
  const uint32_t align_a = alignment(g.a), align_b = alignment(g.b), align_d = alignment(g.d),
                 align_x = std::min(g.aux ? alignment(g.aux) : 256u, g.bias ? alignment(g.bias) : 256u);
  const Key key{device,         g.transpose_a,   g.m,       g.n,           g.k,         g.lda,
                g.ldb,          g.ldd,           int64_t(g.epilogue), g.bias != nullptr, align_a, align_b,
                align_d,        align_x,         sm_count_target,     int64_t(g.a_type), int64_t(g.b_type),
                int64_t(g.d_type), g.accumulate, g.fast_accum,        g.transpose_b};
  // Per thread (the forward's and autograd's): a plan's descriptor is written on every call.
  thread_local std::map<Key, std::unique_ptr<Plan>> plans;
  auto& plan = plans[key];
  if (!plan) plan = make_plan(g, ctx, {align_a, align_b, align_d});
  if (plan->candidates.empty()) return false;  // no kernel for this epilogue and shape: the caller composes
  void* workspace = workspace_of(ctx, device, stream);
  if (g.bias) set(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (g.aux) set(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
  if (g.a_scale) set(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.a_scale);
  if (g.b_scale) set(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.b_scale);
  const float alpha = 1.f, beta = g.accumulate ? 1.f : 0.f;
  auto launch = [&](int candidate) {
    return cublasLtMatmul(ctx.handle, plan->op, &alpha, g.a, plan->a, g.b, plan->b, &beta, g.d, plan->d, g.d, plan->d,
                          &plan->candidates[size_t(candidate)], workspace, kWorkspaceBytes, stream);
  };
  if (!plan->trial) {
    check(launch(plan->chosen), "matmul");
    return true;
  }
  GemmTrial& trial = *plan->trial;
  const GemmTrial::Turn turn = trial.next(stream);
  // An event that cannot be recorded leaves the call untimed, and no error behind for LibTorch's
  // next launch check to report as its own.
  bool timed = turn.start && cudaEventRecord(turn.start, stream) == cudaSuccess;
  const cublasStatus_t status = launch(turn.candidate);
  timed = timed && cudaEventRecord(turn.end, stream) == cudaSuccess;
  if (turn.start && !timed) (void)cudaGetLastError();
  trial.after(turn, timed, status == CUBLAS_STATUS_SUCCESS);
  if (status != CUBLAS_STATUS_SUCCESS && turn.candidate != 0) check(launch(0), "matmul");  // a candidate refused
  else check(status, "matmul");
  if (const auto& choice = trial.choice(); choice.settled()) {
    plan->chosen = choice.chosen();
    auto& list = tuned_list();
    std::lock_guard<std::mutex> lock(list.mutex);
    list.settled.push_back({g.m, g.n, g.k, choice.candidates(), choice.chosen(), choice.median(0),
                            choice.median(choice.chosen())});
    plan->trial.reset();
  }
  return true;
}

cudaDataType_t cuda_type(Fp8 f) { return f == Fp8::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

}  // namespace

void set_gemm_sm_count_target(int sms) { sm_count_target = sms > 0 ? sms : 0; }

size_t gemm_autotune_settled() {
  auto& list = tuned_list();
  std::lock_guard<std::mutex> lock(list.mutex);
  return list.settled.size();
}

std::string gemm_autotune_summary() {
  auto& list = tuned_list();
  std::lock_guard<std::mutex> lock(list.mutex);
  const auto& tuned = list.settled;
  if (tuned.empty()) return {};
  int changed = 0;
  double first = 0, chosen = 0;
  const Tuned* most = nullptr;  // the largest saving
  for (const auto& t : tuned) {
    if (!std::isfinite(t.first_ms) || !std::isfinite(t.chosen_ms)) continue;  // a first candidate never timed
    first += t.first_ms, chosen += t.chosen_ms;
    if (t.chosen == 0) continue;
    ++changed;
    if (!most || t.first_ms - t.chosen_ms > most->first_ms - most->chosen_ms) most = &t;
  }
  char line[320];
  std::snprintf(line, sizeof line, "%zu shapes' candidates timed in the step (the median of %d calls each), %d "
                "faster than the heuristic's first choice: %.3f -> %.3f ms for one call of each",
                tuned.size(), CandidateChoice::kSamples, changed, first, chosen);
  std::string s = line;
  if (most) {
    std::snprintf(line, sizeof line, " (most: m %lld, n %lld, k %lld, candidate %d of %d, %.1f -> %.1f us)",
                  (long long)most->m, (long long)most->n, (long long)most->k, most->chosen + 1, most->candidates,
                  most->first_ms * 1e3, most->chosen_ms * 1e3);
    s += line;
  }
  return s;
}

void reserve_gemm_workspace(void* stream) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) throw std::runtime_error("cuBLASLt GEMM: no current CUDA device");
  workspace_of(context(), device, static_cast<cudaStream_t>(stream));
}

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

bool gemm_linear(const void* x, int64_t ld_x, const void* w, const void* bias, void* out, int64_t ld_out, int64_t rows,
                 int64_t in_features, int64_t out_features, void* stream) {
  if (rows <= 0 || in_features <= 0 || out_features <= 0) return false;
  // As gemm_bias_gelu: column-major out^T = w x^T, A = w (transposed), B = x^T (stored [in, rows]).
  const Gemm g{true, out_features, rows, in_features, w, in_features, x, ld_x, out, ld_out,
               bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, nullptr};
  return run(g, static_cast<cudaStream_t>(stream));
}

bool gemm_input_grad(const void* dy, int64_t ld_dy, const void* w, void* out, int64_t ld_out, int64_t rows,
                     int64_t out_features, int64_t in_features, void* stream) {
  if (rows <= 0 || in_features <= 0 || out_features <= 0) return false;
  // As gemm_dgelu without its epilogue: column-major out^T = w^T dy^T, A = w^T (stored [in, out_f]).
  const Gemm g{false, in_features, rows, out_features, w, in_features, dy, ld_dy, out, ld_out,
               CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr};
  return run(g, static_cast<cudaStream_t>(stream));
}

bool gemm_weight_grad(const void* dy, int64_t ld_dy, const void* x, int64_t ld_x, void* main, DType main_type,
                      int64_t rows, int64_t out_features, int64_t in_features, bool accumulate, void* stream) {
  if (rows <= 0 || in_features <= 0 || out_features <= 0) return false;
  // Row-major main[out_f, in] = dy^T x is column-major main^T [in, out_f] = x^T dy: A = x^T
  // (stored [in, rows]), B = dy taken transposed (stored column-major [out_f, rows]).
  Gemm g{false, in_features, out_features, rows, x, ld_x, dy, ld_dy, main, in_features, CUBLASLT_EPILOGUE_DEFAULT,
         nullptr, nullptr};
  g.transpose_b = true;
  g.d_type = main_type == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  g.accumulate = accumulate;
  return run(g, static_cast<cudaStream_t>(stream));
}

bool gemm_fp8_supported(int64_t rows, int64_t cols, int64_t k) {
  return rows > 0 && cols > 0 && k > 0 && rows % 16 == 0 && cols % 16 == 0 && k % 16 == 0;
}

bool gemm_fp8(const Fp8Operand& a, const Fp8Operand& b, const void* bias, DType d_type, void* d, int64_t rows,
              int64_t cols, int64_t k, bool accumulate, bool fast_accum, void* stream) {
  if (!gemm_fp8_supported(rows, cols, k) || (a.format == Fp8::e5m2 && b.format == Fp8::e5m2)) return false;
  // Row-major d[rows, cols] = a[rows, k] b[cols, k]^T is column-major d^T = b a^T: A = b (stored
  // [k, cols] column-major, transposed), B = a (stored [k, rows]): the "TN" layout, the only one
  // Hopper's fp8 GEMMs take.
  Gemm g{true, cols, rows, k, b.data, k, a.data, k, d, cols, bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT,
         bias, nullptr};
  g.a_type = cuda_type(b.format);
  g.b_type = cuda_type(a.format);
  g.d_type = d_type == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  g.a_scale = b.scale;
  g.b_scale = a.scale;
  g.accumulate = accumulate;
  g.fast_accum = fast_accum;
  return run(g, static_cast<cudaStream_t>(stream));
}

}  // namespace me::kernels
