// fp8_cast_transpose (engine/kernels/fp8_cast.cu) against a CPU reference (cuda_fp8.h's own
// host conversion, saturating), then timed.
//   dev/cuda/fp8_cast [rows] [cols]       (default 8192 x 8192: a GPT-39B-width activation)
// Checks, bit for bit: the row-major fp8 bytes, their transpose, and amax; a scale that pushes
// values past the format's largest finite value (saturation, not inf); NaN staying NaN; edges
// (sizes not multiples of 32). With GeLU in the cast (GPT's MLP): against the same formula on the
// host, where the host's tanhf and the device's may differ in the last bit and so move a value
// across an fp8 rounding boundary: at most 1 in 10,000 bytes may differ, by one fp8 step.
#include <cuda_fp8.h>

#include "dev/cuda/common.h"
#include "engine/kernels/kernels.h"

using namespace me::kernels;

namespace {

uint8_t host_fp8(float v, Fp8 f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, f == Fp8::e4m3 ? __NV_E4M3 : __NV_E5M2));
}

float host_gelu(float x) {
  constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
  return 0.5f * x * (1.f + std::tanh(kBeta * (x + kKappa * x * x * x)));
}

template <typename T>
bool run(DType dt, Fp8 f, const char* name, int64_t rows, int64_t cols, float scale_value, bool with_nan,
         bool gelu = false) {
  std::printf("%s, %lld x %lld, scale %g\n", name, (long long)rows, (long long)cols, scale_value);
  const size_t n = size_t(rows) * cols;
  auto x = dev::random_floats(n, 3.f, 11);
  if (dt == DType::bf16) x = dev::round_bf16(x);
  if (with_nan) x[n / 2] = NAN;
  float amax_ref = 0;
  std::vector<uint8_t> q_ref(n), qt_ref(n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = gelu ? host_gelu(x[size_t(r * cols + c)]) : x[size_t(r * cols + c)];
      if (std::fabs(v) > amax_ref) amax_ref = std::fabs(v);
      q_ref[size_t(r * cols + c)] = qt_ref[size_t(c * rows + r)] = host_fp8(v * scale_value, f);
    }
  dev::DeviceBuffer<T> d_x(n);
  dev::DeviceBuffer<uint8_t> d_q(n), d_qt(n);
  dev::DeviceBuffer<float> d_scale(1), d_amax(1);
  dev::upload(d_x, x);
  CUDA_CHECK(cudaMemcpy(d_scale.ptr, &scale_value, sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(d_amax.ptr, 0, sizeof(float)));
  fp8_cast_transpose(dt, f, d_x.ptr, rows, cols, d_scale.ptr, d_q.ptr, d_qt.ptr, d_amax.ptr, nullptr, nullptr, gelu);
  std::vector<uint8_t> q(n), qt(n);
  float amax = 0;
  CUDA_CHECK(cudaMemcpy(q.data(), d_q.ptr, n, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(qt.data(), d_qt.ptr, n, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(&amax, d_amax.ptr, sizeof(float), cudaMemcpyDeviceToHost));
  size_t bad = 0, bad_t = 0, far = 0;
  for (size_t i = 0; i < n; ++i) {
    bad += q[i] != q_ref[i], bad_t += qt[i] != qt_ref[i];
    far += std::abs(int(q[i]) - int(q_ref[i])) > 1 || std::abs(int(qt[i]) - int(qt_ref[i])) > 1;
  }
  const bool ok = gelu ? far == 0 && bad <= n / 10000 && bad_t <= n / 10000 && std::fabs(amax - amax_ref) <= 1e-6f * amax_ref
                       : bad == 0 && bad_t == 0 && amax == amax_ref;
  std::printf("  check %-28s %s (%zu of %zu bytes differ, transpose %zu; amax %g want %g)\n", "fp8 bytes, transpose, amax",
              ok ? "ok  " : "FAIL", bad, n, bad_t, amax, amax_ref);
  if (n >= (size_t{1} << 20)) {
    dev::report("cast", dev::time_ms([&] {
      fp8_cast_transpose(dt, f, d_x.ptr, rows, cols, d_scale.ptr, d_q.ptr, nullptr, d_amax.ptr, nullptr, nullptr);
    }), double(n) * (sizeof(T) + 1));
    dev::report(gelu ? "gelu + cast + transpose" : "cast + transpose", dev::time_ms([&] {
      fp8_cast_transpose(dt, f, d_x.ptr, rows, cols, d_scale.ptr, d_q.ptr, d_qt.ptr, d_amax.ptr, nullptr, nullptr, gelu);
    }), double(n) * (sizeof(T) + 2));
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 8192, cols = argc > 2 ? std::atoll(argv[2]) : 8192;
  dev::require_gpu();
  dev::report_copy_bandwidth();
  bool ok = run<__nv_bfloat16>(DType::bf16, Fp8::e4m3, "bf16 -> e4m3", rows, cols, 448.f / 15.f, false);
  ok &= run<__nv_bfloat16>(DType::bf16, Fp8::e5m2, "bf16 -> e5m2", rows, cols, 1.f, false);
  ok &= run<float>(DType::f32, Fp8::e4m3, "f32 -> e4m3", 1000, 3000, 448.f / 15.f, false);
  ok &= run<__nv_bfloat16>(DType::bf16, Fp8::e4m3, "bf16 -> e4m3, saturating scale, a NaN, odd edges", 37, 45, 1000.f, true);
  // the 64-aligned kernel's edge cases (the sizes above are its fast path or the general one)
  ok &= run<float>(DType::f32, Fp8::e4m3, "f32 -> e4m3, 64-aligned, saturating scale, a NaN", 128, 192, 1000.f, true);
  ok &= run<__nv_bfloat16>(DType::bf16, Fp8::e5m2, "bf16 -> e5m2, 64-aligned, a NaN", 256, 320, 1.f, true);
  // GeLU inside the cast: GPT-39B's MLP activation (tokens x 4h), and the general kernel's edges
  ok &= run<__nv_bfloat16>(DType::bf16, Fp8::e4m3, "bf16 -> gelu -> e4m3", 2048, 32768, 448.f / 15.f, false, true);
  ok &= run<__nv_bfloat16>(DType::bf16, Fp8::e4m3, "bf16 -> gelu -> e4m3, odd edges, a NaN", 37, 45, 448.f / 15.f, true,
                           true);
  return ok ? 0 : 1;
}
