// Shared by the dev/cuda programs: each one checks a kernel of engine/kernels against a plain
// CPU reference on random inputs, then times it and reports the memory bandwidth it reaches
// (these kernels are bandwidth-bound: bytes moved / time is the figure to compare with the
// GPU's copy bandwidth, printed first). Exit status 1 when a check fails.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#define CUDA_CHECK(x)                                                                      \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

namespace dev {

// Exit 77 (ctest's "skipped") on a machine without a GPU: CI builds these but cannot run them.
inline void require_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA GPU here: skipped (run it on the GPU machine)\n");
    std::exit(77);
  }
}

inline std::vector<float> random_floats(size_t n, float scale, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// Round to bf16 and back: the values a bf16 tensor actually holds.
inline std::vector<float> round_bf16(std::vector<float> v) {
  for (auto& x : v) x = __bfloat162float(__float2bfloat16(x));
  return v;
}

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&ptr, count * sizeof(T) + 16)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// fp32 host values -> a device buffer of bf16 or f32.
template <typename T>
void upload(DeviceBuffer<T>& d, const std::vector<float>& host) {
  std::vector<T> tmp(host.size());
  for (size_t i = 0; i < host.size(); ++i) tmp[i] = static_cast<T>(host[i]);
  CUDA_CHECK(cudaMemcpy(d.ptr, tmp.data(), tmp.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T>
std::vector<float> download(const DeviceBuffer<T>& d, size_t n) {
  std::vector<T> tmp(n);
  CUDA_CHECK(cudaMemcpy(tmp.data(), d.ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(tmp[i]);
  return out;
}

// max |got - want| / (atol + rtol |want|) must stay <= 1.
inline bool check(const char* what, const std::vector<float>& got, const std::vector<float>& want, double rtol,
                  double atol) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = std::fabs(double(got[i]) - want[i]);
    const double e = diff == 0 ? 0.0 : diff / (atol + rtol * std::fabs(want[i]));
    if (!(e <= worst)) worst = e, at = i;  // NaN counts as worst
  }
  const bool ok = worst <= 1.0;
  std::printf("  check %-28s %s (worst %.3g of tolerance at %zu: got %.6g want %.6g)\n", what, ok ? "ok  " : "FAIL",
              worst, at, got.empty() ? 0.0 : got[at], want.empty() ? 0.0 : want[at]);
  return ok;
}

// Mean milliseconds per call over `iters` after a warm-up.
inline float time_ms(const std::function<void()>& fn, int iters = 50) {
  for (int i = 0; i < 5; ++i) fn();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) fn();
  CUDA_CHECK(cudaEventRecord(b));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  CUDA_CHECK(cudaGetLastError());
  return ms / iters;
}

inline void report(const char* what, float ms, double bytes) {
  std::printf("  time  %-28s %8.3f ms  %7.1f GB/s\n", what, ms, bytes / (ms * 1e-3) / 1e9);
}

// The device-to-device copy bandwidth of this GPU, the ceiling for the kernels here.
inline void report_copy_bandwidth() {
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer<char> a(bytes), b(bytes);
  const float ms = time_ms([&] { CUDA_CHECK(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice)); }, 20);
  report("cudaMemcpy (read+write)", ms, 2.0 * bytes);
}

}  // namespace dev
