// `megaengine doctor`: what this machine offers the engine, then the seeds' host and container
// checklists, one pass / fail / skip line each (or JSON with --json).
#include <torch/torch.h>

#include "bindings/cli/doctor.h"
#include "engine/launch/bootstrap.h"
#include "engine/doctor/doctor_checks.h"
#include "engine/doctor/env_probe.h"
#include "engine/comm/gloo_group.h"
#include "engine/comm/nccl_group.h"
#include "engine/core/error.h"
#include "engine/core/torch_compat.h"

namespace me::lua {
namespace {

const char* kDoctorUsage =
    "usage: megaengine doctor [--json]\n"
    "\n"
    "Reports LibTorch, the communication backends and the launch variables, then checks this machine\n"
    "against the cluster's host and container checklists, one line each (PASS, FAIL or SKIP with why):\n"
    "  host:      NVIDIA driver >= 535.54.03, GPU count, NVLink peer access, EFA devices and installer\n"
    "             (>= 1.26.1), /fsx and /scratch writable with free space\n"
    "  container: CUDA toolkit vs the driver, NCCL, aws-ofi-nccl, libfabric with the efa provider,\n"
    "             the FI_ and NCCL_ variables\n"
    "  --json     the same as one JSON object\n"
    "\n"
    "environment: ME_DOCTOR_PATHS=dir1:dir2 (default /fsx:/scratch), ME_DOCTOR_MIN_FREE_GB (default 10),\n"
    "             ME_DOCTOR_GPUS (expected GPU count; default SLURM_GPUS_ON_NODE, else at least one;\n"
    "             0: this machine has no GPU, skip the GPU checks)\n"
    "exit status: 0 when no check failed (SKIP is not a failure), 1 when one did, 2 for bad usage\n";

#ifdef ME_TORCH_HAS_CUDA
constexpr bool kGpuBuild = true;
#else
constexpr bool kGpuBuild = false;
#endif

}  // namespace

DoctorOutput run_doctor(const std::vector<std::string>& args) {
  bool json = false;
  for (const auto& a : args) {
    if (a == "--json") json = true;
    else if (a == "-h" || a == "--help") return {kDoctorUsage, 0};
    else return {cat("megaengine doctor: unknown argument '", a, "'\n", kDoctorUsage), 2};
  }
  const bool cuda = compat::cuda_available();
  const std::string torch_line =
      cat(compat::torch_version(), cuda ? cat(", CUDA available, ", static_cast<int>(torch::cuda::device_count()), " GPUs")
                                        : std::string(", no CUDA in this build or no GPU"));
  const std::string backends_line =
      cat("gloo ", comm::gloo_available() ? "yes (CPU collectives)" : "no (this LibTorch ships no gloo headers)", "; nccl ",
          comm::nccl_available() ? "linked, " + comm::nccl_version() : std::string("not built (CPU LibTorch)"));
  std::string launch_line;
  try {
    launch_line = launch::read_launch_env().describe();
  } catch (const std::exception& e) {
    launch_line = cat("environment is inconsistent: ", e.what());
  }

  doctor::DoctorFacts facts = doctor::gather_facts(doctor::real_system(), kGpuBuild);
  facts.cuda = doctor::probe_cuda();
  facts.nvml = doctor::probe_nvml();
  facts.nccl = doctor::probe_nccl();
  facts.fabric = doctor::probe_libfabric();
  const auto checks = doctor::run_checks(facts);
  const int status = doctor::doctor_exit_status(checks);
  if (json)
    return {doctor::checks_json(checks, {{"megaengine", ME_VERSION}, {"torch", torch_line}, {"backends", backends_line},
                                       {"launch", launch_line}}),
            status};
  std::string out = cat("megaengine ", ME_VERSION, "\n", "LibTorch:   ", torch_line, "\n", "backends:   ", backends_line,
                        "\n", "launch:     ", launch_line, "\n");
  out += doctor::format_report(facts.fabric, facts.nccl, facts.cuda);
  out += doctor::format_checks(checks);
  return {out, status};
}

}  // namespace me::lua
