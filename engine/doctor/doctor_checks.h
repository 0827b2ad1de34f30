// `megaengine doctor`'s checklists: the seeds' host scan (driver >= 535.54.03, GPUs, NVLink, EFA,
// /fsx and /scratch) and container scan (CUDA toolkit, NCCL, aws-ofi-nccl, libfabric with efa,
// the FI_ and NCCL_ variables), one pass / fail / skip line each, as text or JSON.
//
// Facts are gathered first (gather_facts reads a SystemView; the caller adds the dlopen probes of
// env_probe.h), then judged by run_checks, a pure function the tests feed with made-up machines.
//
// Status rules: "fail" is something that stops or slows training on this machine, with what to do;
// "skip" is a check that does not apply here, with the reason (a CPU build has no GPU to check, a
// node without EFA devices needs no EFA stack, one GPU has no peers). Exit status: 1 when any
// check failed, else 0 (doctor_exit_status).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/doctor/env_probe.h"
#include "engine/doctor/system_view.h"

namespace me::doctor {

inline constexpr const char* kMinDriverVersion = "535.54.03";
inline constexpr const char* kMinEfaInstaller = "1.26.1";
inline constexpr uint64_t kDefaultMinFreeBytes = 10ull << 30;  // ME_DOCTOR_MIN_FREE_GB, default 10

enum class CheckStatus { pass, fail, skip };
const char* status_name(CheckStatus s);  // "pass", "fail", "skip"

struct Check {
  std::string group;   // "host" or "container"
  std::string name;    // "driver", "gpus", "nvlink", "efa", "/fsx", "cuda-toolkit", "nccl", ...
  CheckStatus status = CheckStatus::skip;
  std::string value;   // the key figure ("580.95.05", "8", "2.28.3"), "" when none
  std::string detail;  // what was found; for fail and skip, why and what to do
};

struct DirFact {
  std::string path;
  bool named = false;  // listed in ME_DOCTOR_PATHS: missing is a failure, not a skip
  DirProbe probe;
};

struct DoctorFacts {
  // LibTorch with CUDA and ME_DOCTOR_GPUS not 0: missing GPU pieces fail instead of skip.
  bool gpu_expected = false;
  std::string no_gpu_reason;  // why GPU checks are skipped when gpu_expected is false
  bool under_slurm = false;   // SLURM_JOB_ID set: /fsx and /scratch must be there
  int expected_gpus = 0;      // ME_DOCTOR_GPUS, else SLURM_GPUS_ON_NODE; 0: at least one
  std::string proc_driver;    // from /proc/driver/nvidia/version
  CudaReport cuda;
  NvmlReport nvml;
  NcclReport nccl;
  FabricReport fabric;
  std::vector<std::string> efa_devices;
  std::string efa_installer;  // "" when /opt/amazon/efa_installed_packages is missing
  NetPlugin plugin;
  CudaToolkit toolkit;
  std::vector<std::pair<std::string, std::string>> fi_nccl_env;  // FI_* and NCCL_*, sorted
  std::vector<std::string> net_interfaces;                         // /sys/class/net
  std::vector<DirFact> dirs;
  uint64_t min_free_bytes = kDefaultMinFreeBytes;
};

// Everything but the dlopen probes (cuda, nvml, nccl, fabric), which the caller fills in.
// gpu_build: this megaengine's LibTorch has CUDA. ME_DOCTOR_GPUS=0 says the machine has no GPU
// (an image built on a GPU-less head node runs its tests there): GPU checks skip then too.
DoctorFacts gather_facts(const SystemView& sys, bool gpu_build);

std::vector<Check> run_checks(const DoctorFacts& facts);

// "host checklist" / "container checklist" blocks of "  pass  name  value: detail" lines and a
// closing "doctor: N passed, N failed, N skipped" line.
std::string format_checks(const std::vector<Check>& checks);
// {"header": {...}, "status": "pass"|"fail", "passed": N, "failed": N, "skipped": N, "checks": [...]}
std::string checks_json(const std::vector<Check>& checks,
                        const std::vector<std::pair<std::string, std::string>>& header);
int doctor_exit_status(const std::vector<Check>& checks);

// JSON string literal with the escapes RFC 8259 requires.
std::string json_quote(const std::string& s);

}  // namespace me::doctor
