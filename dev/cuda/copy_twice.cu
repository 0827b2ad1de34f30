// kernels::copy_twice (engine/kernels/copy_twice.cu), the copy engines' all-gather's first step:
// both copies byte for byte equal to the source, the source untouched, the unaligned path (two
// cudaMemcpyAsync) as well; then timed against the two copies it replaces.
//   dev/cuda/copy_twice [rows] [hidden]   (default 2048 x 8192 bf16: a LLaMA-2-70B chunk at tp 2)
#include <cstring>

#include "dev/cuda/common.h"
#include "engine/kernels/kernels.h"

using namespace me::kernels;

// `bytes` of random bytes copied from `offset` bytes into a source buffer to `offset` bytes into
// two others: both must equal the source and the bytes around them stay as they were.
bool check_copy(const char* what, size_t bytes, size_t offset) {
  std::vector<unsigned char> host(bytes + 2 * 64);
  unsigned x = 12345;
  for (auto& c : host) c = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 16);
  dev::DeviceBuffer<unsigned char> src(host.size()), a(host.size()), b(host.size());
  CUDA_CHECK(cudaMemcpy(src.ptr, host.data(), host.size(), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(a.ptr, 0xA5, host.size()));
  CUDA_CHECK(cudaMemset(b.ptr, 0x5A, host.size()));
  copy_twice(a.ptr + offset, b.ptr + offset, src.ptr + offset, bytes, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<unsigned char> got_a(host.size()), got_b(host.size()), got_src(host.size());
  CUDA_CHECK(cudaMemcpy(got_a.data(), a.ptr, host.size(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(got_b.data(), b.ptr, host.size(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(got_src.data(), src.ptr, host.size(), cudaMemcpyDeviceToHost));
  bool ok = std::memcmp(got_a.data() + offset, host.data() + offset, bytes) == 0 &&
            std::memcmp(got_b.data() + offset, host.data() + offset, bytes) == 0 && got_src == host;
  for (size_t i = 0; i < host.size(); ++i)
    if (i < offset || i >= offset + bytes) ok = ok && got_a[i] == 0xA5 && got_b[i] == 0x5A;
  std::printf("  check %-44s %s\n", what, ok ? "ok" : "FAIL");
  return ok;
}

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 2048, hidden = argc > 2 ? std::atoll(argv[2]) : 8192;
  dev::require_gpu();
  dev::report_copy_bandwidth();
  const size_t bytes = size_t(rows) * hidden * 2;  // bf16
  std::printf("copy_twice, %lld x %lld bf16 (%zu bytes)\n", (long long)rows, (long long)hidden, bytes);
  bool ok = check_copy("aligned (the kernel)", bytes, 0);
  ok &= check_copy("a size not of 16 bytes (two copies)", 4096 * 3 + 6, 0);
  ok &= check_copy("off 16-byte alignment (two copies)", 4096 * 3, 2);
  ok &= check_copy("one vector", 16, 16);
  dev::DeviceBuffer<char> src(bytes), a(bytes), b(bytes);
  dev::report("copy_twice (one read, two writes)",
              dev::time_ms([&] { copy_twice(a.ptr, b.ptr, src.ptr, bytes, nullptr); }), 3.0 * bytes);
  dev::report("two cudaMemcpyAsync", dev::time_ms([&] {
                CUDA_CHECK(cudaMemcpyAsync(a.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice));
                CUDA_CHECK(cudaMemcpyAsync(b.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice));
              }),
              4.0 * bytes);
  return ok ? 0 : 1;
}
