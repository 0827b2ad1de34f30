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

#include "engine/checkpoint/metadata.h"
#include "engine/checkpoint/safetensors.h"
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
  const auto newest = latest();
  if (keep <= 0 || !newest) return deleted;
  std::vector<int64_t> lineage;
  for (const int64_t it : committed())
    if (it <= *newest) lineage.push_back(it);
  for (size_t i = 0; i + static_cast<size_t>(keep) < lineage.size(); ++i) {
    files::remove_tree(iteration_path(lineage[i]));
    deleted.push_back(lineage[i]);
  }
  if (!deleted.empty()) fsync_directory(dir_);
  return deleted;
}

std::vector<int64_t> CheckpointDir::iteration_dirs() const {
  std::vector<int64_t> out;
  for (const auto& name : files::list(dir_))
    if (const auto it = parse_iteration_name(name); it && files::is_directory(files::join(dir_, name))) out.push_back(*it);
  std::sort(out.begin(), out.end());
  return out;
}

std::string CheckpointDir::set_aside(int64_t after, const std::vector<int64_t>& iterations) const {
  const std::string name = iteration_path(after);
  const std::string aside = files::join(dir_, "superseded_after_" + name.substr(name.rfind('/') + 1));
  files::make_directories(aside);
  for (const int64_t it : iterations) {
    const std::string from = iteration_path(it), to = files::join(aside, from.substr(from.rfind('/') + 1));
    if (::rename(from.c_str(), to.c_str()) != 0) fail("cannot move '", from, "' to '", to, "': ", std::strerror(errno));
  }
  fsync_directory(aside);
  fsync_directory(dir_);
  return aside;
}

std::string CheckpointDir::recover_tracker() const {
  const auto present = iteration_dirs();
  if (present.empty()) return "";
  const auto all = committed();
  std::string skipped;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const auto why = verify_iteration(iteration_path(*it));
    if (!why.empty()) {
      skipped += "\n  iteration " + std::to_string(*it) + ": " + why;
      continue;
    }
    // The newer, incomplete ones would collide with this lineage's saves: kept, out of the way.
    std::vector<int64_t> newer;
    for (const int64_t n : present)
      if (n > *it) newer.push_back(n);
    const std::string moved = newer.empty() ? std::string()
                                            : cat("; the newer iterations ", iteration_list(newer), ", incomplete or ",
                                                  "damaged, were moved to ", set_aside(*it, newer), skipped);
    write_file_atomic(files::join(dir_, kTrackerFile), std::to_string(*it) + "\n");
    return cat(dir_, " has iter_* directories but no ", kTrackerFile, ": resuming from iteration ", *it,
               ", the newest complete one (every shard verified), which the tracker names again", moved);
  }
  fail("checkpoint.dir '", dir_, "' holds iter_* directories but no ", kTrackerFile, " and no complete megaengine ",
       "checkpoint", skipped.empty() ? " (none has a metadata.json)" : ":" + skipped,
       "\nit is not a megaengine checkpoint directory, or its saves were all lost: choose another checkpoint.dir, or ",
       "restore or remove those directories");
}

std::string CheckpointDir::rewind(int64_t iteration) const {
  const std::string target = iteration_dir(dir_, iteration, "checkpoint.iteration");
  const std::string aside = files::join(dir_, "superseded_after_" + target.substr(target.rfind('/') + 1));
  if (files::exists(aside))
    return cat("checkpoint.iteration = ", iteration, " was applied already (", aside, " holds what it set aside): ",
               "going on from the latest; remove that directory to go back to iteration ", iteration, " again");
  std::vector<int64_t> newer;
  for (const int64_t it : iteration_dirs())
    if (it > iteration) newer.push_back(it);
  set_aside(iteration, newer);  // also when empty: the mark that a requeued run must not rewind again
  write_file_atomic(files::join(dir_, kTrackerFile), std::to_string(iteration) + "\n");
  return cat("resuming from iteration ", iteration, " (checkpoint.iteration)",
             newer.empty() ? std::string() : cat("; the newer iterations ", iteration_list(newer), " were moved to ", aside,
                                                 " (nothing deleted), out of the way of this run's saves"));
}

std::string resolve_iteration_dir(const std::string& path) {
  ME_CHECK(files::is_directory(path), "checkpoint '", path, "' does not exist or is not a directory");
  if (files::exists(files::join(path, kMetadataFile))) return path;
  const auto latest = CheckpointDir(path).latest();
  ME_CHECK(latest, "'", path, "' is not a checkpoint: it has neither ", kMetadataFile, " (an iter_N directory) nor ",
           kTrackerFile, " (a checkpoint directory)");
  return CheckpointDir(path).iteration_path(*latest);
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

std::string iteration_list(const std::vector<int64_t>& iterations) {
  std::string out;
  for (const int64_t it : iterations) out += (out.empty() ? "" : ", ") + std::to_string(it);
  return out.empty() ? "none" : out;
}

std::string iteration_dir(const std::string& path, int64_t iteration, const std::string& field) {
  const CheckpointDir dir(path);
  const auto path_n = dir.iteration_path(iteration);
  ME_CHECK(files::exists(files::join(path_n, kMetadataFile)), field, " = ", iteration, ": '", path,
           "' holds no complete iteration ", iteration, "; its iterations: ", iteration_list(dir.committed()));
  return path_n;
}

std::string verify_iteration(const std::string& iteration_dir) {
  try {
    const auto file = files::join(iteration_dir, kMetadataFile);
    const auto meta = Metadata::parse(read_file(file), file);
    for (const auto& [name, shard] : meta.shards) {
      const auto path = files::join(iteration_dir, name);
      if (files::file_size(path) != static_cast<int64_t>(shard.bytes))
        return cat("shard '", name, "' is missing or not of its recorded size");
      if (SafetensorsFile(path).crc32c() != shard.crc32c) return cat("shard '", name, "' fails its checksum");
    }
    return "";
  } catch (const Error& e) {
    return e.what();
  }
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
