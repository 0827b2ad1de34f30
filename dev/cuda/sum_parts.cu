// The reduce-scatter's closing sum (engine/kernels/sum_parts.cu) against a CPU reference that
// rounds after each addition as add_ does (so the check is for the same bits), into a new buffer
// and in place, without and with a row layer's bias, then timed against what it replaces: a copy
// of this rank's chunk, then one add per part (and the bias in a pass of its own).
//   dev/cuda/sum_parts [rows] [hidden] [parts]   (default 512 x 8192 x 3: a GPT-39B chunk at tp 4)
#include <algorithm>
#include <memory>

#include "dev/cuda/common.h"
#include "engine/kernels/kernels.h"

using namespace me::kernels;

template <typename T>
float round_to(float x) {
  return static_cast<float>(static_cast<T>(x));
}

template <typename T>
bool run(DType dt, const char* name, int64_t rows, int64_t hidden, int count, size_t misalign = 0) {
  std::printf("%s, %lld x %lld, %d parts\n", name, (long long)rows, (long long)hidden, count);
  const size_t n = size_t(rows) * hidden;
  auto acc = dev::random_floats(n, 1.f, 1);
  std::vector<std::vector<float>> parts;
  for (int j = 0; j < count; ++j) parts.push_back(dev::random_floats(n, 1.f, 2 + j));
  if (dt == DType::bf16) {
    acc = dev::round_bf16(acc);
    for (auto& p : parts) p = dev::round_bf16(p);
  }
  std::vector<float> want(n);
  for (size_t i = 0; i < n; ++i) {
    float s = acc[i];
    for (const auto& p : parts) s = round_to<T>(s + p[i]);
    want[i] = s;
  }
  // Parts may start off 16-byte alignment (the scalar path): `misalign` elements into a buffer.
  dev::DeviceBuffer<T> d_acc(n);
  std::vector<std::unique_ptr<dev::DeviceBuffer<T>>> d_parts;
  std::vector<const void*> ptrs;
  for (const auto& p : parts) {
    d_parts.push_back(std::make_unique<dev::DeviceBuffer<T>>(n + misalign));
    std::vector<float> shifted(n + misalign, 0.f);
    std::copy(p.begin(), p.end(), shifted.begin() + misalign);
    dev::upload(*d_parts.back(), shifted);
    ptrs.push_back(d_parts.back()->ptr + misalign);
  }
  // Into a new buffer first (first untouched), then in place.
  dev::DeviceBuffer<T> d_out(n);
  dev::upload(d_acc, acc);
  sum_parts(dt, d_out.ptr, d_acc.ptr, ptrs.data(), count, n, nullptr);
  bool ok = dev::check("sum into out (bits of adds)", dev::download(d_out, n), want, 0, 0);
  ok &= dev::check("first left as it was", dev::download(d_acc, n), acc, 0, 0);
  sum_parts(dt, d_acc.ptr, d_acc.ptr, ptrs.data(), count, n, nullptr);
  ok &= dev::check("sum in place (bits of adds)", dev::download(d_acc, n), want, 0, 0);
  // With a row layer's bias ([hidden], added last, rounded): into out, then in place.
  auto bias = dev::random_floats(size_t(hidden), 1.f, 99);
  if (dt == DType::bf16) bias = dev::round_bf16(bias);
  std::vector<float> want_b(n);
  for (size_t i = 0; i < n; ++i) want_b[i] = round_to<T>(want[i] + bias[i % size_t(hidden)]);
  dev::DeviceBuffer<T> d_bias{static_cast<size_t>(hidden)};
  dev::upload(d_bias, bias);
  dev::upload(d_acc, acc);
  sum_parts(dt, d_out.ptr, d_acc.ptr, ptrs.data(), count, n, nullptr, d_bias.ptr, hidden);
  ok &= dev::check("sum, then bias, into out (bits of adds)", dev::download(d_out, n), want_b, 0, 0);
  sum_parts(dt, d_acc.ptr, d_acc.ptr, ptrs.data(), count, n, nullptr, d_bias.ptr, hidden);
  ok &= dev::check("sum, then bias, in place (bits of adds)", dev::download(d_acc, n), want_b, 0, 0);
  const double e = sizeof(T);
  dev::report("one pass with the bias",
              dev::time_ms([&] { sum_parts(dt, d_out.ptr, d_acc.ptr, ptrs.data(), count, n, nullptr, d_bias.ptr, hidden); }),
              (count + 2) * n * e);
  dev::report("one pass, then the bias in another", dev::time_ms([&] {
                sum_parts(dt, d_out.ptr, d_acc.ptr, ptrs.data(), count, n, nullptr);
                sum_parts(dt, d_out.ptr, d_out.ptr, nullptr, 0, n, nullptr, d_bias.ptr, hidden);
              }),
              (count + 4) * n * e);
  dev::report("one pass", dev::time_ms([&] { sum_parts(dt, d_out.ptr, d_acc.ptr, ptrs.data(), count, n, nullptr); }),
              (count + 2) * n * e);
  dev::report("a copy, then one add per part", dev::time_ms([&] {
                CUDA_CHECK(cudaMemcpyAsync(d_out.ptr, d_acc.ptr, n * sizeof(T), cudaMemcpyDeviceToDevice));
                for (int j = 0; j < count; ++j) sum_parts(dt, d_out.ptr, d_out.ptr, &ptrs[j], 1, n, nullptr);
              }),
              (2.0 + 3.0 * count) * n * e);
  return ok;
}

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 512, hidden = argc > 2 ? std::atoll(argv[2]) : 8192;
  const int count = argc > 3 ? std::atoi(argv[3]) : 3;
  dev::require_gpu();
  dev::report_copy_bandwidth();
  bool ok = run<__nv_bfloat16>(DType::bf16, "sum_parts bf16", rows, hidden, count);
  ok &= run<float>(DType::f32, "sum_parts f32", rows, hidden, count);
  ok &= run<__nv_bfloat16>(DType::bf16, "sum_parts bf16, 7 parts (tp 8)", 64, hidden, kMaxSumParts);
  ok &= run<__nv_bfloat16>(DType::bf16, "sum_parts bf16, odd size and offset parts (scalar path)", 3, 7, count, 1);
  return ok ? 0 : 1;
}
