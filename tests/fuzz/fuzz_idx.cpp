// Megatron .idx files (with a .bin beside them): IndexedDataset opens them and every sequence
// is read back, or it throws me::Error naming the problem. Anything else (a crash, a read
// outside the mapping, std::bad_alloc from trusting a count, another exception) is a finding.
// The input's first two bytes give the .bin's size (its bytes are a fixed pattern); the rest
// is the .idx. Files go to /dev/shm when it exists (memory, fast), else /tmp.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/core/error.h"
#include "engine/data/indexed_dataset.h"

namespace {

std::string g_prefix;

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  g_prefix = std::string(dir) + "/me_fuzz_idx_" + std::to_string(::getpid());
  std::atexit([] {
    std::remove((g_prefix + ".idx").c_str());
    std::remove((g_prefix + ".bin").c_str());
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  std::string bin(static_cast<size_t>(data[0]) | (static_cast<size_t>(data[1]) << 8), '\0');
  for (size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<char>(i * 7 + 1);
  write_file(g_prefix + ".bin", reinterpret_cast<const uint8_t*>(bin.data()), bin.size());
  write_file(g_prefix + ".idx", data + 2, size - 2);
  try {
    me::data::IndexedDataset ds(g_prefix);
    const auto& docs = ds.document_index();
    if (docs.empty() || static_cast<size_t>(docs.back()) != ds.size()) std::abort();  // checked at open
    for (size_t i = 0; i < ds.size() && i < 4096; ++i) {
      const auto tokens = ds.get(i);
      if (tokens.size() != static_cast<size_t>(ds.length(i))) std::abort();
      if (!tokens.empty()) ds.get(i, tokens.size() / 2, 1);
    }
  } catch (const me::Error&) {
  }
  return 0;
}
