// cuBLASLt's candidate algorithms for the GEMMs a tensor-parallel layer runs, each timed: how much
// the heuristic's first choice (what engine/kernels/cublaslt_gemm.cpp takes) leaves against the
// fastest of its top candidates, at the chunk shapes of tp 2 and tp 4 and the whole shapes of
// tp 1. A research tool, not a kernel check: every candidate's output is compared with the first
// one's (they compute the same product), so a wrong algorithm still fails it, and the first of the
// candidates must be the algorithm a request for one gives (the engine's untimed choice).
//   dev/cuda/gemm_algos [candidates]      (default 16)
#include <cublasLt.h>

#include <algorithm>
#include <string>

#include "dev/cuda/common.h"

using bf16 = __nv_bfloat16;

namespace {

// Pseudo-random values in [-scale, scale) made on the GPU (a hash of the index): the operands
// reach a billion elements, too many to draw on the host.
__global__ void fill_kernel(bf16* p, size_t n, float scale, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ uint32_t(i >> 32) * 40503u ^ seed * 2246822519u;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    p[i] = __float2bfloat16(scale * (float(h >> 8) * (2.f / 16777216.f) - 1.f));
  }
}
void fill(bf16* p, size_t n, float scale, unsigned seed) {
  fill_kernel<<<1024, 256>>>(p, n, scale, seed);
  CUDA_CHECK(cudaGetLastError());
}

void lt_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuBLASLt %s: status %d\n", what, int(s));
    std::exit(2);
  }
}

// A row-major GEMM as the engine runs it. fwd: y[rows, n] = x[rows, k] w[n, k]^T; dgrad:
// dx[rows, k] = dy[rows, n] w[n, k]; wgrad: main[n, k] += dy[rows, n]^T x[rows, k] into fp32.
enum class Kind { fwd, dgrad, wgrad };
struct Shape {
  std::string name;
  Kind kind;
  int64_t rows, n, k;
};

struct Timed {
  float ms;
  int tile, stages, splitk, swizzle, cluster;
};

int algo_attr(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t v = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return -1;
  return int(v);
}

void run_shape(cublasLtHandle_t handle, const Shape& s, int candidates, void* workspace, size_t ws_bytes) {
  // Column-major view (see cublaslt_gemm.cpp): D[m, nn] = op(A)[m, kk] op(B)[kk, nn].
  int64_t m, nn, kk, lda, ldb, ldd;
  cublasOperation_t ta, tb = CUBLAS_OP_N;
  cudaDataType_t d_type = CUDA_R_16BF;
  float beta = 0.f;
  size_t a_elems, b_elems, d_elems;
  switch (s.kind) {
    case Kind::fwd:  // y^T[n, rows] = w[k, n]^T x^T[k, rows]
      m = s.n, nn = s.rows, kk = s.k, ta = CUBLAS_OP_T, lda = s.k, ldb = s.k, ldd = s.n;
      a_elems = size_t(s.n) * s.k, b_elems = size_t(s.rows) * s.k, d_elems = size_t(s.rows) * s.n;
      break;
    case Kind::dgrad:  // dx^T[k, rows] = w^T[k, n] dy^T[n, rows]
      m = s.k, nn = s.rows, kk = s.n, ta = CUBLAS_OP_N, lda = s.k, ldb = s.n, ldd = s.k;
      a_elems = size_t(s.n) * s.k, b_elems = size_t(s.rows) * s.n, d_elems = size_t(s.rows) * s.k;
      break;
    default:  // main^T[k, n] += x^T[k, rows] dy[rows, n]: A = x (col-major [k, rows]), B = dy^T (op T of [n, rows])
      m = s.k, nn = s.n, kk = s.rows, ta = CUBLAS_OP_N, tb = CUBLAS_OP_T, lda = s.k, ldb = s.n, ldd = s.k;
      a_elems = size_t(s.rows) * s.k, b_elems = size_t(s.rows) * s.n, d_elems = size_t(s.n) * s.k;
      d_type = CUDA_R_32F, beta = 1.f;
      break;
  }
  const size_t d_bytes = d_elems * (d_type == CUDA_R_32F ? 4 : 2);
  void *a, *b, *d, *ref;
  CUDA_CHECK(cudaMalloc(&a, a_elems * 2));
  CUDA_CHECK(cudaMalloc(&b, b_elems * 2));
  CUDA_CHECK(cudaMalloc(&d, d_bytes));
  CUDA_CHECK(cudaMalloc(&ref, d_bytes));
  {
    fill(static_cast<bf16*>(a), a_elems, 0.05f, 1);
    fill(static_cast<bf16*>(b), b_elems, 1.f, 2);
  }
  cublasLtMatmulDesc_t op;
  lt_check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  lt_check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
  lt_check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
  cublasLtMatrixLayout_t la, lb, ld;
  lt_check(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta == CUBLAS_OP_T ? kk : m, ta == CUBLAS_OP_T ? m : kk, lda),
           "layout a");
  lt_check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb == CUBLAS_OP_T ? nn : kk, tb == CUBLAS_OP_T ? kk : nn, ldb),
           "layout b");
  lt_check(cublasLtMatrixLayoutCreate(&ld, d_type, m, nn, ldd), "layout d");
  cublasLtMatmulPreference_t pref;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "pref");
  lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                sizeof(ws_bytes)),
           "pref ws");
  std::vector<cublasLtMatmulHeuristicResult_t> results(candidates);
  int found = 0;
  lt_check(cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, ld, ld, pref, candidates, results.data(), &found),
           "heuristic");
  // The engine asks for 8 candidates and, untimed, takes the first: the same algorithm as asking
  // for one (what it asked for before), or the default path would have changed its kernels.
  {
    cublasLtMatmulHeuristicResult_t one{};
    int found_one = 0;
    lt_check(cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, ld, ld, pref, 1, &one, &found_one), "heuristic (1)");
    if (found > 0 && found_one > 0 && std::memcmp(&one.algo, &results[0].algo, sizeof(one.algo)) != 0) {
      std::printf("%-28s the first of %d candidates is not the one of 1: DIFFERENT\n", s.name.c_str(), candidates);
      std::exit(1);
    }
  }
  const float alpha = 1.f;
  const double flop = 2.0 * s.rows * s.n * s.k;
  std::vector<Timed> timed;
  std::vector<float> first_out;
  bool agree = true;
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const auto& algo = results[i].algo;
    auto launch = [&] {
      return cublasLtMatmul(handle, op, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &algo, workspace, ws_bytes, nullptr);
    };
    // Correctness against the first candidate (beta = 0 for the check, then restored).
    CUDA_CHECK(cudaMemset(d, 0, d_bytes));
    if (launch() != CUBLAS_STATUS_SUCCESS) continue;
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> out(std::min<size_t>(d_elems, 1 << 16));
    if (d_type == CUDA_R_32F) {
      CUDA_CHECK(cudaMemcpy(out.data(), d, out.size() * 4, cudaMemcpyDeviceToHost));
    } else {
      std::vector<bf16> t(out.size());
      CUDA_CHECK(cudaMemcpy(t.data(), d, t.size() * 2, cudaMemcpyDeviceToHost));
      for (size_t j = 0; j < t.size(); ++j) out[j] = __bfloat162float(t[j]);
    }
    if (first_out.empty()) {
      first_out = out;
    } else {
      for (size_t j = 0; j < out.size(); ++j)
        if (std::fabs(out[j] - first_out[j]) > 2e-2 * (1 + std::fabs(first_out[j]))) {
          std::printf("  candidate %d disagrees with the first at %zu: %g against %g\n", i, j, out[j], first_out[j]);
          agree = false;
          break;
        }
    }
    const float ms = dev::time_ms([&] { launch(); }, 20);
    timed.push_back({ms, algo_attr(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                     algo_attr(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), algo_attr(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                     algo_attr(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                     algo_attr(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)});
  }
  if (timed.empty()) {
    std::printf("%-28s no algorithm\n", s.name.c_str());
  } else {
    size_t best = 0;
    for (size_t i = 1; i < timed.size(); ++i)
      if (timed[i].ms < timed[best].ms) best = i;
    auto tf = [&](float ms) { return flop / ms / 1e9; };
    std::printf("%-28s %6lld x %6lld x %6lld  first %7.1f us %4.0f TF/s (tile %d split %d)  best #%zu of %zu %7.1f us "
                "%4.0f TF/s (tile %d stages %d split %d swz %d cluster %d)  gain %4.1f%%%s\n",
                s.name.c_str(), (long long)s.rows, (long long)s.n, (long long)s.k, timed[0].ms * 1e3, tf(timed[0].ms),
                timed[0].tile, timed[0].splitk, best, timed.size(), timed[best].ms * 1e3, tf(timed[best].ms),
                timed[best].tile, timed[best].stages, timed[best].splitk, timed[best].swizzle, timed[best].cluster,
                100.0 * (timed[0].ms / timed[best].ms - 1), agree ? "" : "  DISAGREE");
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
  cudaFree(a), cudaFree(b), cudaFree(d), cudaFree(ref);
  if (!agree) std::exit(1);
}

// One layer's GEMMs at a width, tensor-parallel degree and tokens per micro-batch: the chunked
// ones at rows = tokens / tp (a peer's chunk), the weight gradients at all the tokens.
void layer_shapes(std::vector<Shape>& out, const std::string& width, int64_t tokens, int64_t h, int64_t qkv,
                  int64_t ffn_in, int64_t ffn_out, int tp) {
  const int64_t r = tokens / tp;
  const std::string p = width + " tp" + std::to_string(tp) + " ";
  out.push_back({p + "qkv fwd", Kind::fwd, r, qkv / tp, h});
  out.push_back({p + "proj fwd", Kind::fwd, r, h, h / tp});
  out.push_back({p + "fc1 fwd", Kind::fwd, r, ffn_in / tp, h});
  out.push_back({p + "fc2 fwd", Kind::fwd, r, h, ffn_out / tp});
  out.push_back({p + "fc2 dgrad", Kind::dgrad, r, h, ffn_out / tp});
  out.push_back({p + "fc1 dgrad", Kind::dgrad, r, ffn_in / tp, h});
  out.push_back({p + "proj dgrad", Kind::dgrad, r, h, h / tp});
  out.push_back({p + "qkv dgrad", Kind::dgrad, r, qkv / tp, h});
  out.push_back({p + "fc2 wgrad", Kind::wgrad, tokens, h, ffn_out / tp});
  out.push_back({p + "fc1 wgrad", Kind::wgrad, tokens, ffn_in / tp, h});
  out.push_back({p + "proj wgrad", Kind::wgrad, tokens, h, h / tp});
  out.push_back({p + "qkv wgrad", Kind::wgrad, tokens, qkv / tp, h});
}

}  // namespace

int main(int argc, char** argv) {
  const int candidates = argc > 1 ? std::atoi(argv[1]) : 16;
  dev::require_gpu();
  cublasLtHandle_t handle;
  lt_check(cublasLtCreate(&handle), "handle");
  const size_t ws_bytes = size_t{32} << 20;
  void* workspace;
  CUDA_CHECK(cudaMalloc(&workspace, ws_bytes));
  std::vector<Shape> shapes;
  for (int tp : {1, 2, 4}) layer_shapes(shapes, "gpt39b", 2048, 8192, 3 * 8192, 4 * 8192, 4 * 8192, tp);
  for (int tp : {1, 2, 4}) layer_shapes(shapes, "llama70b", 4096, 8192, 8192 + 2 * 1024, 2 * 28672, 28672, tp);
  // bench/speed's one-GPU models at micro 4: 8,192 tokens
  layer_shapes(shapes, "gpt1.3b", 8192, 2048, 3 * 2048, 4 * 2048, 4 * 2048, 1);
  layer_shapes(shapes, "llama1b", 8192, 2048, 2048 + 2 * 256, 2 * 5632, 5632, 1);
  for (const auto& s : shapes) run_shape(handle, s, candidates, workspace, ws_bytes);
  cudaFree(workspace);
  cublasLtDestroy(handle);
  std::printf("gemm_algos: every candidate agreed\n");
  return 0;
}
