// train.deterministic (engine/core/determinism.h): the settings are applied, said, and the
// tripwire is armed. That the GPU's results are then bit-identical is test_kernels.cpp's
// "deterministic mode" case and bench/determinism/check.sh's runs.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <optional>
#include <utility>
#include <vector>
#include <string>

#include "engine/core/determinism.h"
#include "engine/core/torch_compat.h"

namespace {

// Sets (or unsets, for nullptr) environment variables for one scope, restoring them after.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      const char* had = std::getenv(name);
      saved_.push_back({name, had ? std::optional<std::string>(had) : std::nullopt});
      if (value) setenv(name, value, 1);
      else unsetenv(name);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) setenv(name.c_str(), value->c_str(), 1);
      else unsetenv(name.c_str());
    }
    at::globalContext().setDeterministicAlgorithms(false, false);  // the rest of the suite as it was
    at::globalContext().setDeterministicCuDNN(false);
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace

TEST_CASE("train.deterministic: LibTorch's tripwire armed; cuBLAS, NCCL and attention fixed and said", "[determinism]") {
  ScopedEnv env{{"CUBLAS_WORKSPACE_CONFIG", nullptr}, {"NCCL_ALGO", nullptr}, {"NCCL_PROTO", nullptr},
                {"ME_ATTENTION", nullptr}, {"ME_GEMM_AUTOTUNE", nullptr}};
  const std::string line = me::apply_deterministic_mode();
  CHECK(me::deterministic_mode());
  CHECK(at::globalContext().deterministicAlgorithms());
  CHECK(at::globalContext().deterministicCuDNN());
  CHECK_FALSE(at::globalContext().benchmarkCuDNN());
  CHECK(std::string(std::getenv("CUBLAS_WORKSPACE_CONFIG")) == ":4096:8");
  CHECK(std::string(std::getenv("NCCL_ALGO")) == "Ring");
  CHECK(std::string(std::getenv("NCCL_PROTO")) == "Simple");
  CHECK(std::string(std::getenv("ME_ATTENTION")) == "flash");
  CHECK(std::string(std::getenv("ME_GEMM_AUTOTUNE")) == "0");
  CHECK(line == "LibTorch deterministic algorithms (a nondeterministic op throws), cuDNN deterministic, "
                "CUBLAS_WORKSPACE_CONFIG=:4096:8, NCCL_ALGO=Ring, NCCL_PROTO=Simple, attention ME_ATTENTION=flash "
                "(its deterministic backward; forward cuDNN's where heads are not grouped), cuBLASLt GEMMs untimed "
                "(ME_GEMM_AUTOTUNE=0: the heuristic's first algorithm), new tensors not NaN-filled");
  // The tripwire: what LibTorch reports as nondeterministic now stops the run.
  CHECK_THROWS_WITH(at::globalContext().alertNotDeterministic("an op without a deterministic kernel"),
                    Catch::Contains("an op without a deterministic kernel"));
}

TEST_CASE("train.deterministic keeps what the environment fixes, and refuses what cannot be deterministic",
          "[determinism]") {
  {
    ScopedEnv env{{"CUBLAS_WORKSPACE_CONFIG", ":16:8"}, {"NCCL_ALGO", "Tree"}, {"NCCL_PROTO", nullptr},
                  {"ME_ATTENTION", nullptr}};
    const std::string line = me::apply_deterministic_mode();
    CHECK_THAT(line, Catch::Contains("CUBLAS_WORKSPACE_CONFIG=:16:8 (from the environment)"));
    CHECK_THAT(line, Catch::Contains("NCCL_ALGO=Tree (from the environment)"));
    CHECK(std::string(std::getenv("NCCL_ALGO")) == "Tree");
  }
  {
    ScopedEnv env{{"CUBLAS_WORKSPACE_CONFIG", ":0:0"}};
    CHECK_THROWS_WITH(me::apply_deterministic_mode(), Catch::Contains("CUBLAS_WORKSPACE_CONFIG=':0:0' does not fix"));
  }
  {
    ScopedEnv env{{"CUBLAS_WORKSPACE_CONFIG", nullptr}, {"ME_ATTENTION", "cudnn"}};
    CHECK_THROWS_WITH(me::apply_deterministic_mode(), Catch::Contains("ME_ATTENTION=cudnn has no deterministic"));
  }
  {
    ScopedEnv env{{"CUBLAS_WORKSPACE_CONFIG", nullptr}, {"ME_ATTENTION", nullptr}, {"ME_GEMM_AUTOTUNE", "1"}};
    CHECK_THROWS_WITH(me::apply_deterministic_mode(), Catch::Contains("ME_GEMM_AUTOTUNE=1 picks GEMM algorithms by timing"));
  }
}
