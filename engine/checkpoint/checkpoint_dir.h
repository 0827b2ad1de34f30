// A checkpoint directory laid out as Megatron's: <dir>/iter_0001000/ per saved iteration and
// <dir>/latest_checkpointed_iteration.txt naming the latest committed one. A save is written
// into <dir>/iter_N.tmp-<nonce>/ and committed by renaming it to iter_N/ (after every file and
// the directory are fsynced) and only then replacing the tracker file atomically (temporary
// file, fsync, rename, fsync of the directory): a crash at any moment leaves the previous
// checkpoint complete and named by the tracker. Torch-free.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace me::checkpoint {

inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";
// A tracker holding "release" (Megatron's converted and released checkpoints) names the
// <dir>/release directory: latest() returns this, and iteration_path() maps it there.
inline constexpr int64_t kReleaseIteration = -1;
inline constexpr const char* kMetadataFile = "metadata.json";

class CheckpointDir {
 public:
  explicit CheckpointDir(std::string dir) : dir_(std::move(dir)) {}

  const std::string& path() const { return dir_; }
  std::string iteration_path(int64_t iteration) const;  // <dir>/iter_0001000 (<dir>/release)
  // The iteration the tracker names (kReleaseIteration for "release"), or none when there is no
  // tracker. A tracker naming a directory that does not exist, or text that is not an iteration,
  // is an error naming it.
  std::optional<int64_t> latest() const;

  // Creates <dir> if needed and <dir>/iter_N.tmp-<nonce>/; returns the latter.
  std::string begin(int64_t iteration, const std::string& nonce) const;
  // Commits a temporary directory whose files are all written and fsynced (see above).
  // false (nothing changed) when iter_N already exists.
  bool commit(int64_t iteration, const std::string& tmp) const;
  // Removes iter_*.tmp-* directories a crashed save left; returns their names.
  std::vector<std::string> remove_leftovers() const;
  // Committed iterations (iter_N directories holding metadata.json), oldest first.
  std::vector<int64_t> committed() const;
  // Deletes the oldest committed iterations beyond the newest `keep` (0: keep all); never the
  // one the tracker names. Returns the iterations deleted.
  std::vector<int64_t> prune(int64_t keep) const;

 private:
  std::string dir_;
};

// A path given to a load, resolved to an iteration directory: a checkpoint directory (its
// latest iteration) or an iter_N directory itself. me::Error naming the path otherwise.
std::string resolve_iteration_dir(const std::string& path);

// fsync of a directory (its entries), and a file written atomically (temporary, fsync, rename,
// fsync of its directory).
void fsync_directory(const std::string& dir);
void write_file_atomic(const std::string& path, const std::string& content);
std::string read_file(const std::string& path);
// A random hex string (from /dev/urandom) for temporary names.
std::string random_nonce();

}  // namespace me::checkpoint
