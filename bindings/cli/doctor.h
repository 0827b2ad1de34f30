#pragma once
#include <string>
#include <vector>

namespace me::lua {

// `megaengine doctor [--json]`: LibTorch, backends, launch variables, the NCCL / CUDA / libfabric
// probes, then the host and container checklists (engine/doctor/doctor_checks.h).
struct DoctorOutput {
  std::string text;     // what to print on stdout
  int exit_status = 0;  // 1 when a check failed, 2 for bad usage
};
DoctorOutput run_doctor(const std::vector<std::string>& args);

}  // namespace me::lua
