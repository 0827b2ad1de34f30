// Who am I in the job: rank, world size, local rank and the rendezvous address, read from
// the variables Slurm's srun or a torchrun-style launcher (including `megaengine --nproc`) sets.
#pragma once
#include <functional>
#include <string>

namespace me::launch {

struct LaunchEnv {
  int rank = 0, world = 1;
  int local_rank = 0, local_world = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single";  // "slurm", "torchrun" or "single" (no launcher)
  std::string node_list;          // Slurm's SLURM_JOB_NODELIST, when there is one

  std::string describe() const;
};

using GetEnv = std::function<const char*(const char*)>;

// torchrun-style variables (RANK, WORLD_SIZE, ...) win over Slurm's, so `srun megaengine
// --nproc 8` and torchrun inside an allocation both work. Throws me::Error naming the
// variable for values that are malformed or inconsistent (RANK=4 with WORLD_SIZE=4).
LaunchEnv read_launch_env(const GetEnv& getenv);
LaunchEnv read_launch_env();

// The CUDA device a local rank drives: Slurm's --gpus-per-task leaves one visible GPU per
// task (use it); otherwise local_rank indexes the visible GPUs.
int pick_cuda_device(int local_rank, int visible_devices);

}  // namespace me::launch
