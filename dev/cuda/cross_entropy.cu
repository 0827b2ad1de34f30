// Cross entropy from logits (engine/kernels/cross_entropy.cu) against a CPU reference in fp64:
// per-row max, sum of exponentials and target logit, and the in-place gradient; then timed.
//   dev/cuda/cross_entropy [rows] [vocab]     (default 8192 x 32000: LLaMA 1B, micro 4 x 2048)
#include "dev/cuda/common.h"
#include "engine/kernels/kernels.h"

using namespace me::kernels;

template <typename T>
bool run(DType dt, const char* name, int64_t rows, int64_t vocab, int64_t vocab_start, int64_t real = -1) {
  if (real < 0) real = vocab;  // columns from `real` on: vocabulary padding
  std::printf("%s, %lld rows x %lld (shard from %lld)\n", name, (long long)rows, (long long)vocab,
              (long long)vocab_start);
  const size_t n = size_t(rows) * vocab;
  auto x = dev::random_floats(n, 3.f, 4);
  if (dt == DType::bf16) x = dev::round_bf16(x);
  std::vector<int64_t> labels(rows);
  std::vector<float> grad_row(rows);
  std::mt19937 gen(5);
  for (int64_t r = 0; r < rows; ++r) {
    labels[r] = r % 7 == 3 ? -100 : int64_t(gen() % uint32_t(real + vocab_start));  // some ignored, some elsewhere
    grad_row[r] = labels[r] < 0 ? 0.f : 1.f / rows;
  }
  std::vector<float> max_ref(rows), sum_ref(rows), target_ref(rows), lse(rows), grad_ref(n);
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < real; ++j) m = std::max(m, double(x[r * vocab + j]));
    for (int64_t j = 0; j < real; ++j) s += std::exp(x[r * vocab + j] - m);
    const int64_t l = labels[r] - vocab_start;
    max_ref[r] = float(m), sum_ref[r] = float(s), target_ref[r] = l >= 0 && l < vocab ? x[r * vocab + l] : 0.f;
    lse[r] = float(m + std::log(s));
    for (int64_t j = 0; j < vocab; ++j)
      grad_ref[r * vocab + j] =
          float(((j < real ? std::exp(double(x[r * vocab + j]) - lse[r]) : 0.0) - (j == l)) * grad_row[r]);
  }
  dev::DeviceBuffer<T> d_x(n);
  dev::DeviceBuffer<int64_t> d_labels(rows);
  dev::DeviceBuffer<float> d_max(rows), d_sum(rows), d_target(rows), d_lse(rows), d_grad_row(rows);
  dev::upload(d_x, x);
  CUDA_CHECK(cudaMemcpy(d_labels.ptr, labels.data(), rows * sizeof(int64_t), cudaMemcpyHostToDevice));
  dev::upload(d_lse, lse);
  dev::upload(d_grad_row, grad_row);
  cross_entropy_stats(dt, d_x.ptr, rows, vocab, real, d_labels.ptr, vocab_start, d_max.ptr, d_sum.ptr, d_target.ptr, nullptr);
  bool ok = dev::check("row max", dev::download(d_max, rows), max_ref, 1e-6, 1e-6);
  ok &= dev::check("row sum of exp", dev::download(d_sum, rows), sum_ref, 1e-4, 1e-6);
  ok &= dev::check("target logit", dev::download(d_target, rows), target_ref, 0, 0);
  cross_entropy_backward(dt, d_x.ptr, d_x.ptr, rows, vocab, real, d_labels.ptr, vocab_start, d_lse.ptr, d_grad_row.ptr,
                         nullptr);  // in place, as the engine calls it
  const double tol = dt == DType::bf16 ? 8e-3 : 1e-4;
  ok &= dev::check("gradient (in place)", dev::download(d_x, n), grad_ref, tol, 1e-7);
  dev::upload(d_x, x);
  const double bytes = double(n) * sizeof(T);
  dev::report("stats (forward)", dev::time_ms([&] {
    cross_entropy_stats(dt, d_x.ptr, rows, vocab, real, d_labels.ptr, vocab_start, d_max.ptr, d_sum.ptr, d_target.ptr, nullptr);
  }), bytes);
  dev::report("backward, in place", dev::time_ms([&] {
    cross_entropy_backward(dt, d_x.ptr, d_x.ptr, rows, vocab, real, d_labels.ptr, vocab_start, d_lse.ptr, d_grad_row.ptr, nullptr);
  }), 2 * bytes);
  return ok;
}

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 8192, vocab = argc > 2 ? std::atoll(argv[2]) : 32000;
  dev::require_gpu();
  dev::report_copy_bandwidth();
  bool ok = run<__nv_bfloat16>(DType::bf16, "cross entropy bf16", rows, vocab, 0);
  ok &= run<float>(DType::f32, "cross entropy f32", rows / 4, vocab, 0);
  ok &= run<__nv_bfloat16>(DType::bf16, "cross entropy bf16, second of two shards", rows / 4, vocab / 2, vocab / 2);
  ok &= run<__nv_bfloat16>(DType::bf16, "cross entropy bf16, odd vocab (scalar path)", 9, 1001, 0);
  ok &= run<__nv_bfloat16>(DType::bf16, "cross entropy bf16, 50257 of 50304 real (padding)", rows / 8, 50304, 0, 50257);
  return ok ? 0 : 1;
}
