// Saving a checkpoint from every rank at once, asynchronously. At a step boundary each rank
// copies its pieces to host memory (the pause) and a background thread writes them into
// <dir>/iter_N.tmp-<nonce>/rank_R.safetensors while training goes on. Once every rank's write
// is done (the ranks agree on that at a step boundary, see Trainer), rank 0 writes
// metadata.json with every shard's size and checksum and commits the directory
// (CheckpointDir::commit), then deletes what `keep` no longer keeps. A save waits for the
// previous one to commit first; finish() waits for the last.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/metadata.h"
#include "engine/checkpoint/state.h"

namespace me::comm {
class Communicator;
}

namespace me::checkpoint {

struct SaverOptions {
  std::string dir;
  int64_t keep = 0;    // committed checkpoints to keep (0: all)
  bool async = true;   // write in the background
  // Test facility: the writer sleeps this long after each MiB (ME_TEST_CHECKPOINT_SLOW_MS), so
  // that the kill test's SIGKILL lands inside it.
  int slow_ms = 0;
};

class CheckpointSaver {
 public:
  // `comm` null: one process.
  CheckpointSaver(SaverOptions options, comm::Communicator* comm);
  ~CheckpointSaver();  // waits for the writer; commits nothing (finish() does)

  const SaverOptions& options() const { return options_; }
  // Allocates the host buffers for saves of `tensors` in the background (pinned allocation of
  // many GB takes seconds; the first save would pause for it). save() waits for it.
  void prepare(const std::vector<StateTensor>& tensors);
  // Every rank, at the same step boundary: snapshots `tensors` and starts writing them. `meta`
  // holds what is not a tensor (iteration, recipe, layout...). Waits for a pending save first.
  void save(const std::vector<StateTensor>& tensors, Metadata meta);
  bool pending() const { return pending_.has_value(); }
  // Whether this rank's write is still running.
  bool writing() const;
  // Every rank, at the same point, with `all_done` agreed by all of them: commits the pending
  // save once every rank has written its shard. Returns whether it committed.
  bool commit_if_done(bool all_done);
  // Every rank: waits for this rank's write, then commits.
  void finish();
  // What became of the saves, as every rank knows it once they have committed (or not): the
  // iteration saved last (-1: none), the one attempted last (-1: none), and why that one was
  // not saved ("" when it was, or is still pending).
  int64_t committed_iteration() const { return committed_; }
  int64_t attempted_iteration() const { return attempted_; }
  const std::string& failure() const { return failure_; }

 private:
  struct Pending {
    int64_t iteration = 0;
    std::string tmp, file;
    Metadata meta;  // rank 0: every rank's pieces
    int64_t bytes = 0;
    double pause_ms = 0;
    std::chrono::steady_clock::time_point started;
  };
  struct Written {
    WriteResult result;
    double seconds = 0;
    std::string error;
  };
  void join();
  // Rank 0: writes the metadata and commits; returns why it could not ("" when it did).
  std::string commit(const std::vector<std::string>& results);
  std::string commit_or_explain(const std::vector<std::string>& results);

  SaverOptions options_;
  comm::Communicator* comm_;
  int rank_ = 0;
  CheckpointDir dir_;
  HostSnapshot snapshot_;
  std::optional<Pending> pending_;
  std::thread writer_, preparer_;
  Written written_;
  std::atomic<bool> writing_{false};
  int64_t committed_ = -1, attempted_ = -1;
  std::string failure_;
};

}  // namespace me::checkpoint
