// The tensor-parallel chunks' GEMMs through cuBLASLt with kept plans (engine/kernels/cublaslt_gemm.cpp
// gemm_linear, gemm_input_grad) against a CPU reference in fp64: out = x w^T (+ b) and
// dx = dy w, on row ranges of larger matrices (leading dimension > width, as the chunks are),
// odd row counts; then, for the GPT-39B width's chunks at tp 4 (512 rows), GPU time against
// cublasGemmEx and the host's microseconds per call of each: at tp 4 the step waits for the slowest
// rank's host, and LibTorch's mm on a narrowed view costs it several times cuBLASLt's one call.
//   dev/cuda/chunk_gemm [rows] [hidden] [out]     (default 512 x 8192 x 6144: QKV's chunk at tp 4)
#include <cublas_v2.h>

#include <chrono>

#include "dev/cuda/common.h"
#include "engine/kernels/kernels.h"

using namespace me::kernels;
using bf16 = __nv_bfloat16;

namespace {

// Matrices stored with `pad` extra elements per row (ld = width + pad), as a chunk's rows sit in
// a wider buffer; the reference reads the same values.
bool check_case(int64_t rows, int64_t in, int64_t out, bool with_bias, int64_t pad) {
  std::printf("%lld x %lld -> %lld%s, rows padded by %lld\n", (long long)rows, (long long)in, (long long)out,
              with_bias ? ", bias" : "", (long long)pad);
  const int64_t ldx = in + pad, ldo = out + pad;
  auto x = dev::round_bf16(dev::random_floats(size_t(rows) * ldx, 1.f, 1));
  auto w = dev::round_bf16(dev::random_floats(size_t(out) * in, 0.05f, 2));
  auto b = dev::round_bf16(dev::random_floats(size_t(out), 0.5f, 3));
  auto dy = dev::round_bf16(dev::random_floats(size_t(rows) * ldo, 1.f, 4));
  std::vector<float> y_ref(size_t(rows) * out), dx_ref(size_t(rows) * in);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = with_bias ? b[o] : 0.0;
      for (int64_t i = 0; i < in; ++i) acc += double(x[r * ldx + i]) * w[o * in + i];
      y_ref[r * out + o] = float(acc);
    }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < in; ++i) {
      double acc = 0;
      for (int64_t o = 0; o < out; ++o) acc += double(dy[r * ldo + o]) * w[o * in + i];
      dx_ref[r * in + i] = float(acc);
    }
  dev::DeviceBuffer<bf16> d_x{x.size()}, d_w{w.size()}, d_b{b.size()}, d_dy{dy.size()}, d_y{size_t(rows) * ldo},
      d_dx{size_t(rows) * ldx};
  dev::upload(d_x, x), dev::upload(d_w, w), dev::upload(d_b, b), dev::upload(d_dy, dy);
  bool ok = gemm_linear(d_x.ptr, ldx, d_w.ptr, with_bias ? d_b.ptr : nullptr, d_y.ptr, ldo, rows, in, out, nullptr);
  ok = ok && gemm_input_grad(d_dy.ptr, ldo, d_w.ptr, d_dx.ptr, ldx, rows, out, in, nullptr);
  if (!ok) {
    std::printf("  no cuBLASLt kernel for the shape: FAILED\n");
    return false;
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  auto strip = [rows](const std::vector<float>& v, int64_t width, int64_t ld) {
    std::vector<float> out(size_t(rows) * width);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < width; ++c) out[r * width + c] = v[r * ld + c];
    return out;
  };
  // bf16 outputs of fp32 sums: a relative error of a few bf16 ulps
  ok &= dev::check("out = x w^T (+ b)", strip(dev::download(d_y, size_t(rows) * ldo), out, ldo), y_ref, 1e-2, 1e-2);
  ok &= dev::check("dx = dy w", strip(dev::download(d_dx, size_t(rows) * ldx), in, ldx), dx_ref, 1e-2, 1e-2);
  return ok;
}

double host_us_per_call(const std::function<void()>& issue) {
  issue();
  CUDA_CHECK(cudaDeviceSynchronize());
  const int calls = 200;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) issue();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
  CUDA_CHECK(cudaDeviceSynchronize());
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 512, hidden = argc > 2 ? std::atoll(argv[2]) : 8192,
                out = argc > 3 ? std::atoll(argv[3]) : 6144;
  dev::require_gpu();
  bool ok = check_case(37, 64, 48, true, 8);
  ok &= check_case(64, 128, 256, false, 0);
  ok &= check_case(129, 256, 64, true, 16);

  std::printf("timing: %lld x %lld -> %lld (bf16)\n", (long long)rows, (long long)hidden, (long long)out);
  dev::DeviceBuffer<bf16> x{size_t(rows) * hidden}, w{size_t(out) * hidden}, b{static_cast<size_t>(out)},
      y{size_t(rows) * out}, dx{size_t(rows) * hidden};
  CUDA_CHECK(cudaMemset(x.ptr, 0, size_t(rows) * hidden * sizeof(bf16)));
  CUDA_CHECK(cudaMemset(w.ptr, 0, size_t(out) * hidden * sizeof(bf16)));
  CUDA_CHECK(cudaMemset(b.ptr, 0, size_t(out) * sizeof(bf16)));
  cublasHandle_t handle;
  cublasCreate(&handle);
  const float one = 1.f, zero = 0.f;
  auto plain_fwd = [&] {
    cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(rows), int(hidden), &one, w.ptr, CUDA_R_16BF,
                 int(hidden), x.ptr, CUDA_R_16BF, int(hidden), &zero, y.ptr, CUDA_R_16BF, int(out), CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT);
  };
  auto plain_bwd = [&] {
    cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, int(hidden), int(rows), int(out), &one, w.ptr, CUDA_R_16BF,
                 int(hidden), y.ptr, CUDA_R_16BF, int(out), &zero, dx.ptr, CUDA_R_16BF, int(hidden), CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT);
  };
  auto lt_fwd = [&] { gemm_linear(x.ptr, hidden, w.ptr, b.ptr, y.ptr, out, rows, hidden, out, nullptr); };
  auto lt_bwd = [&] { gemm_input_grad(y.ptr, out, w.ptr, dx.ptr, hidden, rows, out, hidden, nullptr); };
  const double flop = 2.0 * rows * hidden * out;
  auto tflops = [&](float ms) { return flop / ms / 1e9; };
  const float f_plain = dev::time_ms(plain_fwd), f_lt = dev::time_ms(lt_fwd);
  const float b_plain = dev::time_ms(plain_bwd), b_lt = dev::time_ms(lt_bwd);
  std::printf("  time  forward: cublasGemmEx %.3f ms (%.0f TFLOP/s), gemm_linear with bias %.3f ms (%.0f TFLOP/s)\n",
              f_plain, tflops(f_plain), f_lt, tflops(f_lt));
  std::printf("  time  input gradient: cublasGemmEx %.3f ms (%.0f TFLOP/s), gemm_input_grad %.3f ms (%.0f TFLOP/s)\n",
              b_plain, tflops(b_plain), b_lt, tflops(b_lt));
  std::printf("  host  per call: cublasGemmEx %.2f us, gemm_linear %.2f us, gemm_input_grad %.2f us\n",
              host_us_per_call(plain_fwd), host_us_per_call(lt_fwd), host_us_per_call(lt_bwd));
  cublasDestroy(handle);
  std::printf("chunk_gemm: %s\n", ok ? "all checks passed" : "FAILED");
  return ok ? 0 : 1;
}
