// Rotary embedding (engine/kernels/rotary.cu) against a CPU reference, forward and inverse, on
// the fused-QKV layout (queries read in place from [b, s, groups, rep + 2, d]), then timed.
//   dev/cuda/rotary [batch] [seq]          (default 4 x 2048, LLaMA 1B: 32 heads, 4 groups, d 64)
#include "dev/cuda/common.h"
#include "engine/kernels/kernels.h"

using namespace me::kernels;

template <typename T>
bool run(DType dt, const char* name, int64_t b, int64_t s, int64_t heads, int64_t groups, int64_t d) {
  std::printf("%s, batch %lld seq %lld heads %lld groups %lld head_dim %lld\n", name, (long long)b, (long long)s,
              (long long)heads, (long long)groups, (long long)d);
  const int64_t rep = heads / groups, half = d / 2;
  const size_t qkv_n = size_t(b) * s * groups * (rep + 2) * d, q_n = size_t(b) * s * heads * d;
  auto qkv = dev::random_floats(qkv_n, 1.f, 3);
  if (dt == DType::bf16) qkv = dev::round_bf16(qkv);
  std::vector<float> cos_half(s * half), sin_half(s * half);
  for (int64_t p = 0; p < s; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double a = p * std::pow(10000.0, -2.0 * i / d);
      cos_half[p * half + i] = float(std::cos(a));
      sin_half[p * half + i] = float(std::sin(a));
    }
  // Query head h of group g sits at qkv[b, s, g, h % rep, :]; output [b, s, heads, d] contiguous.
  auto q_at = [&](int64_t bi, int64_t si, int64_t h) { return ((bi * s + si) * groups + h / rep) * (rep + 2) * d + (h % rep) * d; };
  std::vector<float> y_ref(q_n), back_ref(q_n);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t si = 0; si < s; ++si)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double x1 = qkv[q_at(bi, si, h) + i], x2 = qkv[q_at(bi, si, h) + i + half];
          const double c = cos_half[si * half + i], sn = sin_half[si * half + i];
          const size_t o = ((bi * s + si) * heads + h) * d + i;
          y_ref[o] = float(x1 * c - x2 * sn), y_ref[o + half] = float(x2 * c + x1 * sn);
          back_ref[o] = float(x1 * c + x2 * sn), back_ref[o + half] = float(x2 * c - x1 * sn);
        }
  dev::DeviceBuffer<T> d_qkv(qkv_n), d_y(q_n);
  dev::DeviceBuffer<float> d_cos(s * half), d_sin(s * half);
  dev::upload(d_qkv, qkv);
  dev::upload(d_cos, cos_half);
  dev::upload(d_sin, sin_half);
  // Queries read in place from the fused layout, written as [b, s, heads, d].
  const RowLayout in{b, s, groups, rep, s * groups * (rep + 2) * d, groups * (rep + 2) * d, (rep + 2) * d, d};
  const RowLayout out{b, s, groups, rep, s * heads * d, heads * d, rep * d, d};
  auto launch = [&](bool inverse) {
    rotary(dt, d_qkv.ptr, in, d_y.ptr, out, d, d_cos.ptr, d_sin.ptr, inverse, nullptr);
  };
  const double tol = dt == DType::bf16 ? 8e-3 : 1e-5;
  launch(false);
  bool ok = dev::check("forward", dev::download(d_y, q_n), y_ref, tol, tol);
  launch(true);
  ok &= dev::check("inverse (backward)", dev::download(d_y, q_n), back_ref, tol, tol);
  dev::report("forward (all query heads)", dev::time_ms([&] { launch(false); }), 2.0 * q_n * sizeof(T));
  return ok;
}

int main(int argc, char** argv) {
  const int64_t b = argc > 1 ? std::atoll(argv[1]) : 4, s = argc > 2 ? std::atoll(argv[2]) : 2048;
  dev::require_gpu();
  dev::report_copy_bandwidth();
  bool ok = run<__nv_bfloat16>(DType::bf16, "rotary bf16", b, s, 32, 4, 64);
  ok &= run<float>(DType::f32, "rotary f32", b, s, 32, 4, 64);
  ok &= run<__nv_bfloat16>(DType::bf16, "rotary bf16, one head per group", 2, 5, 4, 4, 6);
  return ok ? 0 : 1;
}
