#include "engine/checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/files.h"

namespace me::checkpoint {

namespace {

// iter_0001000 -> 1000; anything else -> none.
std::optional<int64_t> parse_iteration_name(const std::string& name) {
  if (name.size() < 6 || name.compare(0, 5, "iter_") != 0) return std::nullopt;
  const std::string digits = name.substr(5);
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoll(digits);
}

std::optional<int64_t> parse_tracker(const std::string& text) {
  std::string t = text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (t == "release") return kReleaseIteration;
  if (t.empty() || t.size() > 18 || t.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(t);
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) fail("cannot open '", path, "' to fsync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail("cannot fsync '", path, "': ", std::strerror(err));
}

}  // namespace

std::string CheckpointDir::iteration_path(int64_t iteration) const {
  if (iteration == kReleaseIteration) return files::join(dir_, "release");
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(iteration));
  return files::join(dir_, name);
}

std::optional<int64_t> CheckpointDir::latest() const {
  const auto tracker = files::join(dir_, kTrackerFile);
  if (!files::exists(tracker)) return std::nullopt;
  const auto it = parse_tracker(read_file(tracker));
  ME_CHECK(it, "'", tracker, "' does not hold an iteration number (or \"release\"): fix or remove it");
  ME_CHECK(files::is_directory(iteration_path(*it)), "'", tracker, "' names ",
           *it == kReleaseIteration ? std::string("the release") : cat("iteration ", *it), ", but ",
           iteration_path(*it), " does not exist: restore it, or point the tracker at a saved iteration");
  return it;
}

std::string CheckpointDir::begin(int64_t iteration, const std::string& nonce) const {
  const std::string tmp = iteration_path(iteration) + ".tmp-" + nonce;
  files::make_directories(tmp);
  return tmp;
}

bool CheckpointDir::commit(int64_t iteration, const std::string& tmp) const {
  const std::string final_dir = iteration_path(iteration);
  if (files::exists(final_dir)) return false;
  fsync_directory(tmp);
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
    fail("cannot rename '", tmp, "' to '", final_dir, "': ", std::strerror(errno));
  fsync_directory(dir_);
  write_file_atomic(files::join(dir_, kTrackerFile), std::to_string(iteration) + "\n");
  return true;
}

std::vector<std::string> CheckpointDir::remove_leftovers() const {
  std::vector<std::string> removed;
  const std::string tracker_tmp = std::string(kTrackerFile) + ".tmp-";
  for (const auto& name : files::list(dir_)) {
    const auto dot = name.find(".tmp-");
    const bool save = dot != std::string::npos && parse_iteration_name(name.substr(0, dot));
    if (!save && name.rfind(tracker_tmp, 0) != 0) continue;  // a tracker's own temporary file too
    files::remove_tree(files::join(dir_, name));
    removed.push_back(name);
  }
  return removed;
}

std::vector<int64_t> CheckpointDir::committed() const {
  std::vector<int64_t> out;
  for (const auto& name : files::list(dir_)) {
    const auto it = parse_iteration_name(name);
    if (it && files::exists(files::join(files::join(dir_, name), kMetadataFile))) out.push_back(*it);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int64_t> CheckpointDir::prune(int64_t keep) const {
  std::vector<int64_t> deleted;
  if (keep <= 0) return deleted;
  const auto all = committed();
  const auto newest = latest();
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) {
    if (newest && all[i] == *newest) continue;
    files::remove_tree(iteration_path(all[i]));
    deleted.push_back(all[i]);
  }
  if (!deleted.empty()) fsync_directory(dir_);
  return deleted;
}

std::string resolve_iteration_dir(const std::string& path) {
  ME_CHECK(files::is_directory(path), "checkpoint '", path, "' does not exist or is not a directory");
  if (files::exists(files::join(path, kMetadataFile))) return path;
  const auto latest = CheckpointDir(path).latest();
  ME_CHECK(latest, "'", path, "' is not a checkpoint: it has neither ", kMetadataFile, " (an iter_N directory) nor ",
           kTrackerFile, " (a checkpoint directory)");
  return CheckpointDir(path).iteration_path(*latest);
}

void fsync_directory(const std::string& dir) { fsync_path(dir, O_RDONLY | O_DIRECTORY); }

void write_file_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp-" + random_nonce();
  {
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail("cannot create '", tmp, "': ", std::strerror(errno));
    const char* p = content.data();
    size_t n = content.size();
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        ::close(fd);
        fail("cannot write '", tmp, "': ", std::strerror(errno));
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    const int rc = ::fsync(fd);
    ::close(fd);
    if (rc != 0) fail("cannot fsync '", tmp, "': ", std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename '", tmp, "' to '", path, "': ", std::strerror(errno));
  fsync_directory(files::parent(path));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ME_CHECK(in, "cannot open '", path, "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string random_nonce() {
  std::random_device rd;  // /dev/urandom on Linux
  char out[17];
  std::snprintf(out, sizeof out, "%08x%08x", rd(), rd());
  return out;
}

}  // namespace me::checkpoint
