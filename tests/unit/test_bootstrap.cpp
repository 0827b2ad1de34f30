#include <catch2/catch.hpp>

#include <map>

#include "engine/launch/bootstrap.h"

using me::launch::read_launch_env;

namespace {
me::launch::GetEnv fake(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}
}  // namespace

TEST_CASE("bootstrap: no launcher means a world of one", "[bootstrap]") {
  auto e = read_launch_env(fake({}));
  CHECK(e.rank == 0);
  CHECK(e.world == 1);
  CHECK(e.source == "single");
}

TEST_CASE("bootstrap: torchrun-style variables", "[bootstrap]") {
  auto e = read_launch_env(fake({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                                 {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29555"}}));
  CHECK(e.source == "torchrun");
  CHECK(e.rank == 5);
  CHECK(e.world == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world == 4);
  CHECK(e.master_addr == "node7");
  CHECK(e.master_port == 29555);
}

TEST_CASE("bootstrap: Slurm variables, MASTER_ADDR from the node list", "[bootstrap]") {
  auto e = read_launch_env(fake({{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"},
                                 {"SLURM_TASKS_PER_NODE", "8(x2)"}, {"SLURM_JOB_NODELIST", "p5-[001-004,007],head"}}));
  CHECK(e.source == "slurm");
  CHECK(e.rank == 9);
  CHECK(e.world == 16);
  CHECK(e.local_rank == 1);
  CHECK(e.local_world == 8);
  CHECK(e.master_addr == "p5-001");
  CHECK(e.master_port == 29500);
  // An explicit MASTER_ADDR wins over the node list.
  auto f = read_launch_env(fake({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a[1-2]"},
                                 {"MASTER_ADDR", "10.0.0.1"}}));
  CHECK(f.master_addr == "10.0.0.1");
}

TEST_CASE("bootstrap: bad variables are named", "[bootstrap]") {
  CHECK_THROWS_WITH(read_launch_env(fake({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "x"}})),
                    Catch::Contains("rank 4 is out of range for a world of 4 processes (RANK/WORLD_SIZE)"));
  CHECK_THROWS_WITH(read_launch_env(fake({{"RANK", "x1"}, {"WORLD_SIZE", "4"}})),
                    Catch::Contains("RANK='x1' is not an integer"));
  CHECK_THROWS_WITH(read_launch_env(fake({{"RANK", "1"}})), Catch::Contains("RANK and WORLD_SIZE must be set together"));
  CHECK_THROWS_WITH(read_launch_env(fake({{"RANK", "1"}, {"WORLD_SIZE", "2"}})), Catch::Contains("MASTER_ADDR is not set"));
  CHECK_THROWS_WITH(read_launch_env(fake({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})),
                    Catch::Contains("MASTER_PORT=70000 is not a TCP port"));
  CHECK_THROWS_WITH(read_launch_env(fake({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a[3-1]"}})),
                    Catch::Contains("a[3-1]"));
}

TEST_CASE("bootstrap: a GPU per local rank", "[bootstrap]") {
  CHECK(me::launch::pick_cuda_device(3, 8) == 3);
  CHECK(me::launch::pick_cuda_device(3, 1) == 0);  // Slurm's --gpus-per-task: one visible GPU
  CHECK_THROWS_WITH(me::launch::pick_cuda_device(0, 0), Catch::Contains("no CUDA device is visible"));
  CHECK_THROWS_WITH(me::launch::pick_cuda_device(4, 2), Catch::Contains("local rank 4 has no GPU of its own"));
}
