// Residual add + LayerNorm / RMSNorm (engine/kernels/add_norm.cu) against a CPU reference in
// fp64: forward (sum, y, mean, rstd) and backward (grad_in, grad_weight, grad_bias, and that
// the weight gradient is bitwise repeatable), with and without delta / grad_sum / bias, backward in
// one pass and in two; then timed, and the widths of tp 4 + SP (512 and 2048 rows of 8192).
//   dev/cuda/add_norm [rows] [hidden]     (default 8192 x 2048: LLaMA 1B, micro 4 x seq 2048)
#include "dev/cuda/common.h"
#include "engine/kernels/kernels.h"

using namespace me::kernels;

struct Case {
  bool rms, delta, grad_sum, bias;
  int offset;  // elements every streamed tensor starts past a 16-byte boundary (1: the scalar path)
  bool timed;
};

template <typename T>
bool run(DType dt, const char* name, int64_t rows, int64_t hidden, Case c, NormBackwardPasses passes) {
  std::printf("%s %s, %lld x %lld%s%s%s%s, backward in %s\n", name, c.rms ? "RMSNorm" : "LayerNorm", (long long)rows,
              (long long)hidden, c.delta ? ", delta" : "", c.grad_sum ? ", grad_sum" : "", c.bias ? ", bias" : "",
              c.offset ? ", misaligned" : "", passes == NormBackwardPasses::two ? "two passes" : "one pass");
  const size_t n = size_t(rows) * hidden;
  const bool bf16 = dt == DType::bf16;
  const float eps = 1e-5f;
  auto x = dev::random_floats(n, 1.f, 11), d = dev::random_floats(n, 1.f, 12), dy = dev::random_floats(n, 1.f, 13),
       gs = dev::random_floats(n, 1.f, 14), w = dev::random_floats(hidden, 0.2f, 15),
       b = dev::random_floats(hidden, 0.2f, 16);
  for (size_t i = 0; i < n; ++i) x[i] += float(int64_t(i / hidden) % 7) - 3.f;  // row means away from 0
  for (auto& v : w) v += 1.f;
  if (bf16) x = dev::round_bf16(x), d = dev::round_bf16(d), dy = dev::round_bf16(dy), gs = dev::round_bf16(gs),
            w = dev::round_bf16(w), b = dev::round_bf16(b);

  // The reference: the sum rounded as the kernel stores it, statistics and the rest in fp64.
  std::vector<float> sum_ref(n), y_ref(n), mean_ref(rows), rstd_ref(rows), dx_ref(n), dw_ref(hidden),
      db_ref(hidden);
  std::vector<double> dw_acc(hidden, 0.0), db_acc(hidden, 0.0), xhat(hidden), g(hidden);
  for (int64_t r = 0; r < rows; ++r) {
    const size_t o = size_t(r) * hidden;
    for (int64_t j = 0; j < hidden; ++j) {
      float s = c.delta ? x[o + j] + d[o + j] : x[o + j];
      if (bf16) s = __bfloat162float(__float2bfloat16(s));
      sum_ref[o + j] = s;
    }
    double mean = 0, var = 0;
    if (!c.rms) {
      for (int64_t j = 0; j < hidden; ++j) mean += sum_ref[o + j];
      mean /= hidden;
    }
    for (int64_t j = 0; j < hidden; ++j) var += (sum_ref[o + j] - mean) * (sum_ref[o + j] - mean);
    const double rstd = 1.0 / std::sqrt(var / hidden + eps);
    mean_ref[r] = float(mean), rstd_ref[r] = float(rstd);
    double c1 = 0, c2 = 0;
    for (int64_t j = 0; j < hidden; ++j) {
      xhat[j] = (sum_ref[o + j] - mean) * rstd;
      y_ref[o + j] = float(xhat[j] * w[j] + (c.bias ? b[j] : 0.0));
      g[j] = double(dy[o + j]) * w[j];
      c1 += g[j], c2 += g[j] * xhat[j];
      dw_acc[j] += dy[o + j] * xhat[j];
      db_acc[j] += dy[o + j];
    }
    c1 = c.rms ? 0.0 : c1 / hidden, c2 /= hidden;
    for (int64_t j = 0; j < hidden; ++j)
      dx_ref[o + j] = float(rstd * (g[j] - c1 - xhat[j] * c2) + (c.grad_sum ? gs[o + j] : 0.0));
  }
  for (int64_t j = 0; j < hidden; ++j) dw_ref[j] = float(dw_acc[j]), db_ref[j] = float(db_acc[j]);

  const size_t off = c.offset;
  dev::DeviceBuffer<T> d_x(n + off), d_d(n + off), d_sum(n + off), d_y(n + off), d_dy(n + off), d_gs(n + off),
      d_dx(n + off), d_w(hidden), d_b(hidden);
  dev::DeviceBuffer<float> d_mean(rows), d_rstd(rows), d_dw(hidden), d_db(hidden),
      d_scratch(size_t(add_norm_scratch_floats(rows, hidden)));
  auto upload_at = [&](dev::DeviceBuffer<T>& buf, const std::vector<float>& host) {
    std::vector<float> padded(off, 0.f);
    padded.insert(padded.end(), host.begin(), host.end());
    dev::upload(buf, padded);
    return buf.ptr + off;
  };
  auto download_at = [&](const dev::DeviceBuffer<T>& buf) {
    auto v = dev::download(buf, n + off);
    return std::vector<float>(v.begin() + off, v.end());
  };
  T* px = upload_at(d_x, x);
  T* pd = c.delta ? upload_at(d_d, d) : nullptr;
  T* pdy = upload_at(d_dy, dy);
  T* pgs = c.grad_sum ? upload_at(d_gs, gs) : nullptr;
  T *psum = d_sum.ptr + off, *py = d_y.ptr + off, *pdx = d_dx.ptr + off;
  dev::upload(d_w, w);
  dev::upload(d_b, b);
  const T* pb = c.bias ? d_b.ptr : nullptr;
  float* pdb = c.bias ? d_db.ptr : nullptr;
  const T* pin = c.delta ? psum : px;  // what was normalised

  auto forward = [&] {
    add_norm_forward(dt, c.rms, px, pd, d_w.ptr, pb, psum, py, c.rms ? nullptr : d_mean.ptr, d_rstd.ptr, rows, hidden,
                     eps, nullptr);
  };
  auto backward = [&] {
    add_norm_backward(dt, c.rms, pdy, pgs, pin, c.rms ? nullptr : d_mean.ptr, d_rstd.ptr, d_w.ptr, pdx, d_dw.ptr, pdb,
                      d_scratch.ptr, rows, hidden, nullptr, passes);
  };
  forward();
  backward();
  CUDA_CHECK(cudaDeviceSynchronize());
  const double tol = bf16 ? 8e-3 : 1e-5, wtol = 1e-4 * std::sqrt(double(rows));
  bool ok = true;
  if (c.delta) ok &= dev::check("sum (exact)", download_at(d_sum), sum_ref, 0, 0);
  ok &= dev::check("y", download_at(d_y), y_ref, tol, tol);
  if (!c.rms) ok &= dev::check("mean", dev::download(d_mean, rows), mean_ref, 1e-5, 1e-6);
  ok &= dev::check("rstd", dev::download(d_rstd, rows), rstd_ref, 1e-5, 1e-6);
  ok &= dev::check("grad_in", download_at(d_dx), dx_ref, tol, tol);
  const auto dw = dev::download(d_dw, hidden);
  ok &= dev::check("grad_weight", dw, dw_ref, 1e-4, wtol);
  if (c.bias) ok &= dev::check("grad_bias", dev::download(d_db, hidden), db_ref, 1e-4, wtol);
  backward();
  const bool same = std::memcmp(dw.data(), dev::download(d_dw, hidden).data(), hidden * sizeof(float)) == 0;
  std::printf("  check %-28s %s\n", "grad_weight repeatable", same ? "ok  " : "FAIL");
  ok &= same;

  if (c.timed) {
    const double e = sizeof(T);
    dev::report("forward", dev::time_ms(forward), (c.delta ? 4 : 2) * double(n) * e);
    dev::report("backward", dev::time_ms(backward), (c.grad_sum ? 4 : 3) * double(n) * e);
  }
  return ok;
}

// Every case with backward in one pass and in two.
template <typename T>
bool both(DType dt, const char* name, int64_t rows, int64_t hidden, Case c) {
  bool ok = run<T>(dt, name, rows, hidden, c, NormBackwardPasses::one);
  return run<T>(dt, name, rows, hidden, c, NormBackwardPasses::two) && ok;
}

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 8192, hidden = argc > 2 ? std::atoll(argv[2]) : 2048;
  dev::require_gpu();
  dev::report_copy_bandwidth();
  using bf16 = __nv_bfloat16;
  const auto B = DType::bf16, F = DType::f32;
  // {rms, delta, grad_sum, bias, offset, timed}
  bool ok = both<bf16>(B, "bf16", rows, hidden, {false, true, true, true, 0, true});
  ok &= both<bf16>(B, "bf16", rows, hidden, {true, true, true, false, 0, true});
  ok &= both<float>(F, "f32", rows / 4, hidden, {false, true, true, true, 0, true});
  ok &= both<bf16>(B, "bf16", rows / 4, hidden, {false, false, false, false, 0, false});
  ok &= both<float>(F, "f32", rows / 4, hidden, {true, false, false, false, 0, false});
  // The tensor-parallel widths: a rank's rows at tp 4 + SP (GPT-39B: 2048 / 4, LLaMA-2-70B: 4096 / 4)
  // and tp 1's 2048 rows.
  for (const int64_t r : {512, 1024, 2048}) {
    ok &= both<bf16>(B, "bf16", r, 8192, {false, true, true, true, 0, true});
    ok &= both<bf16>(B, "bf16", r, 8192, {true, true, true, false, 0, true});
  }
  // Tails: a partly filled last block, rows of several warps, the scalar path.
  ok &= both<bf16>(B, "bf16", 37, 1024, {false, true, true, true, 0, false});
  ok &= both<bf16>(B, "bf16", 37, 4096, {true, true, true, false, 0, false});
  ok &= both<bf16>(B, "bf16", 37, 8192, {false, true, false, false, 0, false});
  ok &= both<bf16>(B, "bf16", 300, 8200, {false, true, true, true, 0, false});
  ok &= both<float>(F, "f32", 37, 16384, {false, true, true, true, 0, false});
  ok &= both<bf16>(B, "bf16", 37, 1024, {false, true, true, true, 1, false});
  ok &= both<bf16>(B, "bf16", 7, 1001, {false, true, true, true, 0, false});
  ok &= both<bf16>(B, "bf16", 70, 1001, {false, true, true, true, 1, false});
  ok &= both<float>(F, "f32", 5, 100, {true, true, false, false, 0, false});
  return ok ? 0 : 1;
}
