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
  // Deletes the oldest committed iterations beyond the newest `keep` (0: keep all) of this
  // lineage: those up to the one the tracker names, never that one, never a newer one (another
  // run's, set aside or not). Returns the iterations deleted.
  std::vector<int64_t> prune(int64_t keep) const;
  // No tracker but iter_N directories: names the newest complete one (metadata and every
  // shard's size and CRC-32C verified) in a new tracker, the newer ones moved into
  // <dir>/superseded_after_iter_N/, and returns what it did, for the log ("": no iter_N).
  // me::Error when iter_N directories exist and none is complete (not megaengine's?).
  std::string recover_tracker() const;
  // checkpoint.iteration = N: resume from iteration N instead of the latest. Moves the newer
  // iterations into <dir>/superseded_after_iter_N/ (nothing deleted; this run's saves would
  // collide with them) and points the tracker at N. Done once: when that directory exists, a
  // requeued run goes on from the latest. Returns what it did, for the log ("" if nothing).
  std::string rewind(int64_t iteration) const;

 private:
  std::vector<int64_t> iteration_dirs() const;  // every iter_N directory, complete or not
  // Moves those iterations into <dir>/superseded_after_iter_<after>/; returns its path.
  std::string set_aside(int64_t after, const std::vector<int64_t>& iterations) const;

  std::string dir_;
};

// A path given to a load, resolved to an iteration directory: a checkpoint directory (its
// latest iteration) or an iter_N directory itself. me::Error naming the path otherwise.
std::string resolve_iteration_dir(const std::string& path);
// Iteration `iteration` of checkpoint directory `path`, committed; me::Error naming `field`
// and listing the iterations there otherwise.
std::string iteration_dir(const std::string& path, int64_t iteration, const std::string& field);
// "2, 4, 6" (empty: "none").
std::string iteration_list(const std::vector<int64_t>& iterations);
// Why an iteration directory cannot be loaded (its metadata, or a shard's size or CRC-32C), or
// "" when it is complete.
std::string verify_iteration(const std::string& iteration_dir);

// Whether `name` names a file directly inside a directory: not empty, no '/', not "." or "..".
// A shard name from a checkpoint's metadata or a Hugging Face index must be one, so that a
// damaged or hostile file cannot make a loader read outside its directory.
bool is_plain_file_name(const std::string& name);

// fsync of a directory (its entries), and a file written atomically (temporary, fsync, rename,
// fsync of its directory).
void fsync_directory(const std::string& dir);
void write_file_atomic(const std::string& path, const std::string& content);
std::string read_file(const std::string& path);
// A random hex string (from /dev/urandom) for temporary names.
std::string random_nonce();

}  // namespace me::checkpoint
