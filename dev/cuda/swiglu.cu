// SwiGLU forward/backward (engine/kernels/swiglu.cu) against a CPU reference, then timed.
//   dev/cuda/swiglu [tokens] [ffn]        (default 8192 x 5632: LLaMA 1B, micro 4 x seq 2048)
#include "dev/cuda/common.h"
#include "engine/kernels/kernels.h"

using namespace me::kernels;

template <typename T>
bool run(DType dt, const char* name, int64_t tokens, int64_t ffn) {
  std::printf("%s, %lld x %lld\n", name, (long long)tokens, (long long)ffn);
  const size_t n = size_t(tokens) * ffn;
  auto gu = dev::random_floats(2 * n, 2.f, 1), dy = dev::random_floats(n, 1.f, 2);
  if (dt == DType::bf16) gu = dev::round_bf16(gu), dy = dev::round_bf16(dy);
  std::vector<float> y_ref(n), dx_ref(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const double g = gu[2 * i], u = gu[2 * i + 1], s = 1.0 / (1.0 + std::exp(-g));
    y_ref[i] = float(g * s * u);
    dx_ref[2 * i] = float(dy[i] * u * s * (1 + g * (1 - s)));
    dx_ref[2 * i + 1] = float(dy[i] * g * s);
  }
  dev::DeviceBuffer<T> d_gu(2 * n), d_y(n), d_dy(n), d_dx(2 * n);
  dev::upload(d_gu, gu);
  dev::upload(d_dy, dy);
  swiglu_forward(dt, d_gu.ptr, d_y.ptr, n, nullptr);
  swiglu_backward(dt, d_gu.ptr, d_dy.ptr, d_dx.ptr, n, nullptr);
  const double tol = dt == DType::bf16 ? 8e-3 : 1e-5;
  bool ok = dev::check("forward", dev::download(d_y, n), y_ref, tol, tol);
  ok &= dev::check("backward", dev::download(d_dx, 2 * n), dx_ref, tol, tol);
  const double e = sizeof(T);
  dev::report("forward", dev::time_ms([&] { swiglu_forward(dt, d_gu.ptr, d_y.ptr, n, nullptr); }), 3 * n * e);
  dev::report("backward", dev::time_ms([&] { swiglu_backward(dt, d_gu.ptr, d_dy.ptr, d_dx.ptr, n, nullptr); }),
              5 * n * e);
  return ok;
}

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 8192, ffn = argc > 2 ? std::atoll(argv[2]) : 5632;
  dev::require_gpu();
  dev::report_copy_bandwidth();
  bool ok = run<__nv_bfloat16>(DType::bf16, "swiglu bf16", tokens, ffn);
  ok &= run<float>(DType::f32, "swiglu f32", tokens, ffn);
  ok &= run<__nv_bfloat16>(DType::bf16, "swiglu bf16, odd size (scalar path)", 3, 7);
  return ok ? 0 : 1;
}
