#include "engine/launch/bootstrap.h"

#include <cstdlib>
#include <string>

#include "engine/launch/hostlist.h"
#include "engine/core/error.h"

namespace me::launch {
namespace {

int parse_int(const GetEnv& getenv, const char* name, int fallback, int min_value) {
  const char* v = getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  ME_CHECK(end && *end == '\0' && x >= min_value && x < (1L << 30), "environment variable ", name, "='", v,
           "' is not an integer >= ", min_value);
  return static_cast<int>(x);
}

// SLURM_TASKS_PER_NODE looks like "8(x2)" or "8,4": the first count is ours on a uniform job.
int tasks_per_node(const char* spec) {
  if (!spec || !*spec) return 0;
  return std::atoi(spec);
}

}  // namespace

LaunchEnv read_launch_env(const GetEnv& getenv) {
  LaunchEnv e;
  if (getenv("RANK") || getenv("WORLD_SIZE")) {
    ME_CHECK(getenv("RANK") && getenv("WORLD_SIZE"), "RANK and WORLD_SIZE must be set together (found only ",
             getenv("RANK") ? "RANK" : "WORLD_SIZE", ")");
    e.source = "torchrun";
    e.rank = parse_int(getenv, "RANK", 0, 0);
    e.world = parse_int(getenv, "WORLD_SIZE", 1, 1);
    e.local_rank = parse_int(getenv, "LOCAL_RANK", e.rank, 0);
    e.local_world = parse_int(getenv, "LOCAL_WORLD_SIZE", e.world, 1);
  } else if (getenv("SLURM_PROCID") && getenv("SLURM_NTASKS")) {
    e.source = "slurm";
    e.rank = parse_int(getenv, "SLURM_PROCID", 0, 0);
    e.world = parse_int(getenv, "SLURM_NTASKS", 1, 1);
    e.local_rank = parse_int(getenv, "SLURM_LOCALID", 0, 0);
    const int per_node = tasks_per_node(getenv("SLURM_TASKS_PER_NODE"));
    e.local_world = per_node > 0 ? per_node : parse_int(getenv, "SLURM_NTASKS_PER_NODE", e.world, 1);
    const char* nodes = getenv("SLURM_JOB_NODELIST") ? getenv("SLURM_JOB_NODELIST") : getenv("SLURM_NODELIST");
    if (nodes) e.node_list = nodes;
  } else {
    return e;  // one process, no launcher: nothing to rendezvous with
  }
  ME_CHECK(e.rank < e.world, "rank ", e.rank, " is out of range for a world of ", e.world, " processes (",
           e.source == "slurm" ? "SLURM_PROCID/SLURM_NTASKS" : "RANK/WORLD_SIZE", ")");
  ME_CHECK(e.local_rank < e.local_world, "local rank ", e.local_rank, " is out of range for ", e.local_world,
           " processes per node");
  if (const char* addr = getenv("MASTER_ADDR"); addr && *addr) {
    e.master_addr = addr;
  } else if (!e.node_list.empty()) {
    e.master_addr = first_host(e.node_list);  // rank 0 runs on the first node of the allocation
  } else if (e.world > 1 && e.source == "torchrun") {
    fail("MASTER_ADDR is not set: export it (the host of rank 0), or start the job with srun or megaengine --nproc");
  }
  e.master_port = parse_int(getenv, "MASTER_PORT", 29500, 1);
  ME_CHECK(e.master_port < 65536, "MASTER_PORT=", e.master_port, " is not a TCP port");
  return e;
}

LaunchEnv read_launch_env() {
  return read_launch_env([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

int pick_cuda_device(int local_rank, int visible_devices) {
  ME_CHECK(visible_devices > 0, "no CUDA device is visible to local rank ", local_rank,
           " (check CUDA_VISIBLE_DEVICES and --gpus-per-node)");
  if (visible_devices == 1) return 0;
  ME_CHECK(local_rank < visible_devices, "local rank ", local_rank, " has no GPU of its own: ", visible_devices,
           " are visible; start at most one process per GPU");
  return local_rank;
}

std::string LaunchEnv::describe() const {
  return cat("rank ", rank, "/", world, " (local ", local_rank, "/", local_world, "), rendezvous ", master_addr, ":",
             master_port, " via ", source);
}

}  // namespace me::launch
