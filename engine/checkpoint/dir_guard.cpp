#include "engine/checkpoint/dir_guard.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/core/error.h"
#include "engine/core/files.h"

namespace me::checkpoint {

namespace {

bool is_iteration_name(const std::string& name) {
  return name.size() > 5 && name.compare(0, 5, "iter_") == 0 &&
         name.find_first_not_of("0123456789", 5) == std::string::npos;
}

// The absolute path `path` names, symbolic links resolved, whether or not it exists: the
// longest existing prefix through realpath, the rest (which cannot hold links) lexically.
std::string absolute_path(const std::string& path) {
  std::string base = path.empty() ? "." : path;
  if (base[0] != '/') {
    char cwd[4096];
    ME_CHECK(::getcwd(cwd, sizeof cwd), "cannot read the current directory: ", std::strerror(errno));
    base = files::join(cwd, base);
  }
  std::vector<std::string> parts;
  for (size_t i = 0; i <= base.size();) {
    const size_t slash = std::min(base.find('/', i), base.size());
    const std::string part = base.substr(i, slash - i);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    i = slash + 1;
  }
  // Lexical ".." above is right only without links: resolve the existing prefix for real.
  size_t existing = parts.size();
  auto prefix = [&](size_t n) {
    std::string p;
    for (size_t k = 0; k < n; ++k) p += "/" + parts[k];
    return p.empty() ? std::string("/") : p;
  };
  while (existing > 0 && !files::exists(prefix(existing))) --existing;
  std::string out = files::real_path(prefix(existing));
  for (size_t k = existing; k < parts.size(); ++k) out = files::join(out, parts[k]);
  return out;
}

bool inside(const std::string& path, const std::string& dir) {  // strictly below
  if (dir == "/") return path.size() > 1;
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/';
}

std::string holder_text() {
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const char* job = std::getenv("SLURM_JOB_ID");
  char when[64] = "";
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  return cat("host ", host, ", pid ", ::getpid(), ", Slurm job ", job && *job ? job : "none", ", since ", when, "\n");
}

}  // namespace

void probe_writable(const std::string& field, const std::string& dir) {
  try {
    files::make_directories(dir);
  } catch (const Error& e) {
    fail(field, " = '", dir, "' cannot be used: ", e.what(), ". Choose a directory this process can create and write");
  }
  const std::string probe = files::join(dir, ".megaengine-probe-" + random_nonce());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    fail(field, " = '", dir, "' is not writable: cannot create a file in it (", std::strerror(errno),
         "). Choose a directory this process can write, or fix its permissions or mount");
  const bool wrote = ::write(fd, "probe\n", 6) == 6;
  const int err = errno;
  ::close(fd);
  const bool removed = ::unlink(probe.c_str()) == 0;
  ME_CHECK(wrote, field, " = '", dir, "' is not writable: cannot write a file in it (", std::strerror(err), ")");
  ME_CHECK(removed, field, " = '", dir, "': cannot remove the probe file '", probe, "' (", std::strerror(errno), ")");
}

bool is_checkpoint_dir(const std::string& dir) {
  if (files::exists(files::join(dir, kTrackerFile))) return true;
  for (const auto& name : files::list(dir))
    if (is_iteration_name(name) && files::is_directory(files::join(dir, name))) return true;
  return false;
}

bool is_hf_export(const std::string& dir) {
  bool config = false, weights = false;
  for (const auto& name : files::list(dir)) {
    if (files::is_directory(files::join(dir, name))) return false;
    config = config || name == "config.json";
    const auto ext = std::string(".safetensors");
    weights = weights || (name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0);
  }
  return config && weights && !is_checkpoint_dir(dir);
}

void check_export_target(const std::string& source, const std::string& out, bool force) {
  const std::string target = absolute_path(out);
  const std::string why = ": the export replaces --out, so it would delete that checkpoint. Choose a directory outside it";
  if (!source.empty()) {
    std::string src = absolute_path(source);
    // An iter_N directory: its checkpoint directory is the one to protect.
    if (files::exists(files::join(src, kMetadataFile)) && is_checkpoint_dir(files::parent(src))) src = files::parent(src);
    ME_CHECK(target != src, "export: --out '", out, "' is the checkpoint being exported", why);
    ME_CHECK(!inside(target, src), "export: --out '", out, "' lies inside the checkpoint being exported ('", src, "')", why);
    ME_CHECK(!inside(src, target), "export: --out '", out, "' holds the checkpoint being exported ('", src, "')", why);
  }
  for (std::string p = target;; p = files::parent(p)) {
    ME_CHECK(!(files::is_directory(p) && is_checkpoint_dir(p)), "export: --out '", out, "' ",
             p == target ? "is" : cat("lies inside '", p, "', which is"), " a checkpoint directory", why);
    if (p == "/") break;
  }
  if (!files::exists(target)) return;
  ME_CHECK(files::is_directory(target), "export: --out '", out, "' exists and is not a directory: choose a new directory");
  if (files::list(target).empty()) return;
  ME_CHECK(is_hf_export(target), "export: --out '", out, "' exists and is not an earlier export (config.json and ",
           "*.safetensors files, no directories): choose a new directory; --force replaces only an earlier export");
  ME_CHECK(force, "export: '", out, "' exists and is not empty: choose a new directory (or overwrite it: --force)");
}

DirLock::DirLock(const std::string& dir) {
  files::make_directories(dir);
  const std::string path = files::join(dir, kLockFile);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ME_CHECK(fd_ >= 0, "checkpoint.dir '", dir, "': cannot open its lock file '", path, "': ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder;
    try {
      holder = read_file(path);
    } catch (const Error&) {
    }
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    ME_CHECK(err == EWOULDBLOCK, "checkpoint.dir '", dir, "': cannot lock '", path, "': ", std::strerror(err));
    fail("checkpoint.dir '", dir, "' is in use by another run (", holder.empty() ? "its lock names no holder" : holder,
         "; lock file ", path, "). Two runs on one directory would drop each other's checkpoints: wait for that run ",
         "to end or stop it, or choose another checkpoint.dir");
  }
  const std::string text = holder_text();
  const bool ok = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size());
  ME_CHECK(ok, "checkpoint.dir '", dir, "': cannot write its lock file '", path, "': ", std::strerror(errno));
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

}  // namespace me::checkpoint
