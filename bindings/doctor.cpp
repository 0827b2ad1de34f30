// `megaengine doctor`: what this machine offers the engine, one line per part.
#include <torch/torch.h>

#include "bindings/doctor.h"
#include "engine/comm/bootstrap.h"
#include "engine/comm/env_probe.h"
#include "engine/comm/gloo_group.h"
#include "engine/comm/nccl_group.h"
#include "engine/core/error.h"
#include "engine/core/torch_compat.h"

namespace me::lua {

std::string doctor_report() {
  std::string out = cat("megaengine ", ME_VERSION, "\n");
  const bool cuda = compat::cuda_available();
  out += cat("LibTorch:   ", compat::torch_version(), cuda ? cat(", CUDA available, ", static_cast<int>(torch::cuda::device_count()), " GPUs")
                                                          : std::string(", no CUDA in this build or no GPU"), "\n");
  out += cat("backends:   gloo ", comm::gloo_available() ? "yes (CPU collectives)" : "no (this LibTorch ships no gloo headers)",
             "; nccl ", comm::nccl_available() ? "linked, " + comm::nccl_version() : std::string("not built (CPU LibTorch)"),
             "\n");
  try {
    out += cat("launch:     ", comm::read_launch_env().describe(), "\n");
  } catch (const std::exception& e) {
    out += cat("launch:     environment is inconsistent: ", e.what(), "\n");
  }
  out += comm::format_report(comm::probe_libfabric(), comm::probe_nccl(), comm::probe_cuda());
  return out;
}

}  // namespace me::lua
