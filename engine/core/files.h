// Small POSIX file-system helpers. Not std::filesystem: pip's LibTorch exports std::filesystem
// symbols of another libstdc++ that take over a binary's own calls, with another path layout
// (seen crashing on the GPU machine), so code linked with it stays on POSIX calls.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace me::files {

std::string join(const std::string& dir, const std::string& name);  // "dir/name"
std::string parent(const std::string& path);                         // "." for a bare name
bool exists(const std::string& path);
// The canonical absolute path (realpath); `path` itself when it cannot be resolved.
std::string real_path(const std::string& path);
bool is_directory(const std::string& path);
// The size of a regular file; -1 when it does not exist (errno tells why).
int64_t file_size(const std::string& path);
// mkdir -p; me::Error naming the path on failure.
void make_directories(const std::string& path);
// The names in a directory (no "." or ".."), sorted; empty when it cannot be read.
std::vector<std::string> list(const std::string& dir);
// rm -rf; quiet when the path is already gone.
void remove_tree(const std::string& path);

}  // namespace me::files
