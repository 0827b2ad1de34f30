// Small POSIX file helpers of the metrics writers (no std::filesystem: pip's LibTorch exports
// another libstdc++'s copy of it, which crashes GPU builds).
#pragma once
#include <cstdio>
#include <string>

namespace me::metrics::detail {

// mkdir -p (files::make_directories); me::Error naming `what` (the recipe field), the directory and why.
void make_dirs(const std::string& dir, const char* what);

// Opens `path` for writing; exclusive: fails if it exists (returns nullptr, errno EEXIST).
std::FILE* open_new(const std::string& path);

// fwrite + fflush; me::Error naming `path` if either fails (disk full, ...).
void write_and_flush(std::FILE* f, const std::string& bytes, const std::string& path);

std::string host_name();

}  // namespace me::metrics::detail
