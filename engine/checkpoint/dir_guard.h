// Guards around the directories that hold a run's work, so that none of it is lost or computed
// in vain: output directories checked for writing before the first step, one run at a time per
// checkpoint directory, and an export that would replace a checkpoint refused. Torch-free.
#pragma once
#include <string>

namespace me::checkpoint {

inline constexpr const char* kLockFile = "megaengine.lock";

// Creates `dir` if needed, then creates and removes a probe file in it: a directory that is
// read-only, under /proc or under a regular file fails here, in seconds, instead of at the
// first save. me::Error naming `field` (checkpoint.dir, log.dir) and the path.
void probe_writable(const std::string& field, const std::string& dir);

// Whether `dir` is (or looks like) a checkpoint directory: it holds the tracker file or
// iter_N directories.
bool is_checkpoint_dir(const std::string& dir);

// Whether `dir` is an earlier Hugging Face export: config.json and *.safetensors files, no
// directories, and nothing of a checkpoint's.
bool is_hf_export(const std::string& dir);

// `megaengine export ... --out DIR [--force]`: me::Error unless DIR may be written. Refused: DIR
// is, holds or lies inside the source checkpoint `source` (a checkpoint directory or one of
// its iter_N; "": none) or any checkpoint directory, or is not a directory; an existing,
// non-empty DIR unless it is an earlier export and `force` is set.
void check_export_target(const std::string& source, const std::string& out, bool force);

// An exclusive lock on a checkpoint directory: flock on <dir>/megaengine.lock, whose text names
// the holder (host, pid, Slurm job). The kernel releases it when its process ends, however it
// ends, so a lock left by a dead run never blocks the requeued one.
class DirLock {
 public:
  // Creates `dir` if needed. me::Error naming the holder when another process holds the lock.
  explicit DirLock(const std::string& dir);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace me::checkpoint
