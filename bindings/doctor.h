#pragma once
#include <string>

namespace me::lua {

// LibTorch, backends, launch variables, NCCL, CUDA devices and peer access, libfabric providers.
std::string doctor_report();

}  // namespace me::lua
