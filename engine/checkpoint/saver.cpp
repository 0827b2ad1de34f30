#include "engine/checkpoint/saver.h"

#include <cstdio>
#include <sstream>

#include "engine/comm/communicator.h"
#include "engine/core/format.h"
#include "engine/core/error.h"
#include "engine/core/files.h"
#include "engine/core/log.h"

namespace me::checkpoint {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// One value from every rank (in rank order), or just this one's without a communicator.
std::vector<std::string> gather(comm::Communicator* comm, const std::string& mine) {
  return comm ? comm->all_gather_object(mine) : std::vector<std::string>{mine};
}

}  // namespace

CheckpointSaver::CheckpointSaver(SaverOptions options, comm::Communicator* comm)
    : options_(std::move(options)), comm_(comm), rank_(comm ? comm->rank() : 0), dir_(options_.dir) {}

CheckpointSaver::~CheckpointSaver() {
  join();
  if (preparer_.joinable()) preparer_.join();
}

void CheckpointSaver::prepare(const std::vector<StateTensor>& tensors) {
  if (preparer_.joinable()) preparer_.join();
  preparer_ = std::thread([this, tensors] {
    try {
      snapshot_.prepare(tensors);
    } catch (const std::exception& e) {  // take() allocates whatever is missing
      log::warn("checkpoint: host buffers not prepared ahead (", e.what(), "); the first save allocates them");
    }
  });
}

bool CheckpointSaver::writing() const { return writing_.load(); }

void CheckpointSaver::join() {
  if (writer_.joinable()) writer_.join();
}

void CheckpointSaver::save(const std::vector<StateTensor>& tensors, Metadata meta) {
  finish();  // the previous save commits first
  if (preparer_.joinable()) preparer_.join();
  const auto t0 = std::chrono::steady_clock::now();
  bool any = false;
  for (const auto& t : tensors) any = any || t.save;
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d.safetensors", rank_);
  const std::string file = any ? name : "";
  // Rank 0's nonce names the temporary directory; its metadata collects everyone's pieces.
  Metadata mine = describe_pieces(tensors, file);
  if (any) mine.shards[file] = {rank_, 0, 0};
  const auto all = gather(comm_, (rank_ == 0 ? random_nonce() : std::string("-")) + "\n" + mine.to_json());
  const std::string nonce = all[0].substr(0, all[0].find('\n'));
  if (rank_ == 0)
    for (size_t r = 0; r < all.size(); ++r) {
      const auto other = Metadata::parse(all[r].substr(all[r].find('\n') + 1), cat("rank ", r, "'s pieces"));
      meta.merge_tensors(other);
    }
  attempted_ = meta.iteration;
  failure_.clear();
  Pending p;
  p.iteration = meta.iteration;
  p.tmp = dir_.begin(meta.iteration, nonce);
  p.file = file;
  p.meta = std::move(meta);
  p.bytes = snapshot_.take(tensors);
  p.pause_ms = seconds_since(t0) * 1000;
  p.started = std::chrono::steady_clock::now();
  written_ = {};
  if (any) {
    WriteOptions w;
    if (options_.slow_ms > 0) {  // the kill test's slow writer: 1 MiB at a time
      w.chunk_bytes = 1u << 20;
      w.after_chunk = [ms = options_.slow_ms] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
    }
    const std::string path = files::join(p.tmp, file);
    writing_ = true;
    auto write = [this, path, w] {
      const auto start = std::chrono::steady_clock::now();
      try {
        written_.result = snapshot_.write(path, w);
      } catch (const std::exception& e) {
        written_.error = e.what();
      }
      written_.seconds = seconds_since(start);
      writing_ = false;
    };
    if (options_.async) writer_ = std::thread(write);
    else write();
  }
  if (rank_ == 0)
    log::info("checkpoint iteration ", p.iteration, ": ", human::number(p.bytes / 1e9), " GB of this rank copied to host in ",
              human::number(p.pause_ms), " ms; writing ", options_.async ? "in the background" : "now");
  pending_ = std::move(p);
}

bool CheckpointSaver::commit_if_done(bool all_done) {
  if (!pending_ || !all_done) return false;
  join();
  std::ostringstream mine;
  mine << pending_->file << "\t" << written_.result.bytes << "\t" << written_.result.crc32c << "\t"
       << written_.seconds << "\t" << written_.error;
  const auto results = gather(comm_, mine.str());
  // Every rank learns rank 0's outcome, so that all of them exit alike when a save is lost.
  const auto outcome = gather(comm_, rank_ == 0 ? "=" + commit_or_explain(results) : std::string("-"))[0].substr(1);
  if (outcome.empty()) committed_ = pending_->iteration;
  failure_ = outcome;
  pending_.reset();
  return true;
}

std::string CheckpointSaver::commit_or_explain(const std::vector<std::string>& results) {
  try {
    return commit(results);
  } catch (const std::exception& e) {  // the metadata or the tracker could not be written (a full disk)
    files::remove_tree(pending_->tmp);
    log::error("checkpoint iteration ", pending_->iteration, " was NOT saved (the previous one stays the latest): ", e.what());
    return e.what();
  }
}

std::string CheckpointSaver::commit(const std::vector<std::string>& results) {
  auto& p = *pending_;
  std::string failures;
  double slowest = 0;
  uint64_t total = 0;
  for (size_t r = 0; r < results.size(); ++r) {
    std::istringstream in(results[r]);
    std::string file, bytes, crc, seconds, error;
    std::getline(in, file, '\t');
    std::getline(in, bytes, '\t');
    std::getline(in, crc, '\t');
    std::getline(in, seconds, '\t');
    std::getline(in, error);
    if (!error.empty()) failures += cat("\n  rank ", r, ": ", error);
    if (file.empty() || !error.empty()) continue;
    p.meta.shards[file] = {static_cast<int>(r), std::stoull(bytes), static_cast<uint32_t>(std::stoul(crc))};
    total += std::stoull(bytes);
    slowest = std::max(slowest, std::stod(seconds));
  }
  if (!failures.empty()) {
    files::remove_tree(p.tmp);
    log::error("checkpoint iteration ", p.iteration, " was NOT saved (the previous one stays the latest):", failures);
    return "a rank could not write its shard:" + failures;
  }
  write_file_atomic(files::join(p.tmp, kMetadataFile), p.meta.to_json());
  if (!dir_.commit(p.iteration, p.tmp)) {
    files::remove_tree(p.tmp);
    log::warn("checkpoint iteration ", p.iteration, " exists already in ", dir_.path(), ": kept as it was");
    return cat("iteration ", p.iteration, " exists already in ", dir_.path(), " and was kept as it was");
  }
  const auto pruned = dir_.prune(options_.keep);
  log::info("saved checkpoint iteration ", p.iteration, " to ", dir_.iteration_path(p.iteration), ": ", human::number(total / 1e9),
            " GB in ", p.meta.shards.size(), " shards; pause ", human::number(p.pause_ms), " ms; written in ",
            human::number(slowest), " s (slowest rank), ",
            human::number(slowest > 0 ? static_cast<double>(total) / slowest / 1e9 : 0.0),
            " GB/s over all shards; committed ", human::number(seconds_since(p.started)), " s after its step",
            pruned.empty() ? "" : cat("; deleted ", pruned.size(), " older (checkpoint.keep = ", options_.keep, ")"));
  return "";
}

void CheckpointSaver::finish() {
  if (!pending_) return;
  join();
  commit_if_done(true);
}

}  // namespace me::checkpoint
