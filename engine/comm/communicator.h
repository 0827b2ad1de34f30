// The job's communication state, one object per process (no globals): the rendezvous store
// (served by rank 0, joined with the job token: store_server.h), the world group, groups made
// from a RankGrid, the hosts of all ranks, and a watchdog that publishes this rank's heartbeat
// and collective progress, so a failure can name the rank that died or hung, and that ends the
// job when a rank's heartbeat stays silent for comm.dead_after_s.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/launch/bootstrap.h"
#include "engine/comm/comm_options.h"
#include "engine/comm/process_group.h"
#include "engine/comm/rank_grid.h"
#include "engine/launch/store_client.h"
#include "engine/launch/store_server.h"

namespace c10d {
class Store;
}

namespace me::comm {

class Communicator {
 public:
  Communicator(launch::LaunchEnv env, CommOptions options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  const launch::LaunchEnv& env() const { return env_; }
  const CommOptions& options() const { return options_; }
  int rank() const { return env_.rank; }
  int world_size() const { return env_.world; }
  std::string backend() const { return backend_; }
  int cuda_device() const { return cuda_device_; }  // -1 on CPU

  const std::shared_ptr<ProcessGroup>& world() const { return world_; }
  // A group over `ranks` (global, sorted). Collective over those ranks: each must call it
  // with the same name. Non-members get nullptr.
  std::shared_ptr<ProcessGroup> new_group(const std::string& name, const std::vector<int>& ranks);

  // Small host-side values (hostnames, metadata) from every rank, in rank order, through the store.
  std::vector<std::string> all_gather_object(const std::string& mine);
  const std::vector<std::string>& hosts() const { return hosts_; }  // rank -> hostname
  const std::vector<int>& gpus() const { return gpus_; }             // rank -> CUDA device (-1: cpu)

  // What the other ranks of `group` were doing when its collective #seq failed.
  std::string diagnose(const ProcessGroup& group, int64_t seq);

  // The rendezvous store's address and the job token (empty for a world of one).
  const launch::StoreAddress& store_address() const { return store_address_; }

 private:
  void start_store();
  void watchdog_loop();
  void publish_progress(launch::StoreClient& store, std::chrono::milliseconds timeout);
  void check_heartbeats(launch::StoreClient& store, std::chrono::milliseconds timeout);
  std::string last_collective();
  [[noreturn]] void abort_job(const std::string& why);
  void leave();
  std::chrono::milliseconds heartbeat() const;
  std::chrono::milliseconds dead_after() const;

  launch::LaunchEnv env_;
  CommOptions options_;
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000)); }
  std::chrono::milliseconds rendezvous_timeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(options_.rendezvous_timeout_s * 1000));
  }
  std::string backend_;
  int cuda_device_ = -1;
  std::string cpu_binding_;  // what comm.cpu_bind did (empty on the CPU)
  std::unique_ptr<launch::StoreServer> server_;  // rank 0 only
  launch::StoreAddress store_address_;
  std::string local_host_ = "127.0.0.1";  // where this rank's Gloo pairs listen (start_store)
  c10::intrusive_ptr<c10d::Store> store_;
  std::string rank0_last_;  // rank 0's last heartbeat, read by the watchdog (rank 0 hosts the store)
  std::shared_ptr<ProcessGroup> world_;
  std::vector<std::string> hosts_;
  std::vector<int> gpus_;
  int64_t object_round_ = 0;

  std::mutex groups_mutex_;
  std::vector<std::weak_ptr<ProcessGroup>> groups_;
  std::map<std::string, int64_t> generations_;  // how often each group name was made
  std::map<std::string, int64_t> published_;
  std::thread watchdog_;
  std::atomic<bool> stop_{false};
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
};

// The groups of one rank under a layout: what parallel layers and the trainer use.
struct ParallelGroups {
  RankGrid grid;
  Coords coords;
  std::shared_ptr<ProcessGroup> tp, pp, dp, cp, model_parallel, embedding;
  std::string layout_table;  // rank -> host, GPU, coordinates (printed by rank 0)
  std::vector<std::string> warnings;
};

// Builds every group of the grid in Megatron's order on every rank (each rank joins its own),
// checks that tensor-parallel groups stay inside a node, and describes the layout.
ParallelGroups make_parallel_groups(Communicator& comm, int tp, int pp, int cp = 1);

}  // namespace me::comm
