#include "engine/core/determinism.h"

#include <cstdlib>

#include "engine/core/error.h"
#include "engine/core/torch_compat.h"

namespace me {
namespace {

bool applied = false;

// Sets name=value unless the environment already has a value; returns "name=value" as in force,
// marked "(from the environment)" when it was not ours.
std::string fix_env(const char* name, const char* value) {
  const char* had = std::getenv(name);
  if (had && *had) return cat(name, "=", had, " (from the environment)");
  setenv(name, value, 1);
  return cat(name, "=", value);
}

}  // namespace

std::string apply_deterministic_mode() {
  // cuBLAS reads its workspace configuration when LibTorch creates a handle, and LibTorch checks
  // it before each GEMM in deterministic mode: only these two sizes are accepted.
  const char* ws = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  const std::string have = ws ? ws : "";
  ME_CHECK(have.empty() || have == ":4096:8" || have == ":16:8", "train.deterministic: CUBLAS_WORKSPACE_CONFIG='", have,
           "' does not fix cuBLAS's workspace: unset it (megaengine sets :4096:8) or set :4096:8 or :16:8");
  std::string line = "LibTorch deterministic algorithms (a nondeterministic op throws), cuDNN deterministic, ";
  line += fix_env("CUBLAS_WORKSPACE_CONFIG", ":4096:8");
  line += ", " + fix_env("NCCL_ALGO", "Ring") + ", " + fix_env("NCCL_PROTO", "Simple");
  const char* attention = std::getenv("ME_ATTENTION");
  ME_CHECK(!attention || std::string(attention) != "cudnn", "train.deterministic: ME_ATTENTION=cudnn has no deterministic ",
           "backward: unset ME_ATTENTION (megaengine uses flash) or set ME_ATTENTION=flash");
  line += ", attention " + fix_env("ME_ATTENTION", "flash") + " (its deterministic backward; forward cuDNN's where heads are not grouped)";
  // ME_GEMM_AUTOTUNE=1 has our cuBLASLt GEMMs try their candidates in the step and keep the
  // fastest (kernels/gemm_trial.h), which can differ from one run to the next, and the rounding with it.
  const char* tune = std::getenv("ME_GEMM_AUTOTUNE");
  ME_CHECK(!tune || std::string(tune) != "1", "train.deterministic: ME_GEMM_AUTOTUNE=1 picks GEMM algorithms by ",
           "timing, which can differ from run to run: unset it (megaengine sets 0)");
  setenv("ME_GEMM_AUTOTUNE", "0", 1);
  line += ", cuBLASLt GEMMs untimed (ME_GEMM_AUTOTUNE=0: the heuristic's first algorithm)";
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  // Not LibTorch's NaN fill of every new tensor: a pass per allocation, and no kernel of ours
  // reads memory it has not written (two runs giving the same bits is what the tests check).
  compat::set_deterministic_fill(false);
  line += ", new tensors not NaN-filled";
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
  applied = true;
  return line;
}

bool deterministic_mode() { return applied; }

}  // namespace me
