#include "engine/doctor/doctor_checks.h"
#include "engine/core/strings.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "engine/core/error.h"

namespace me::doctor {
namespace {

Check make(const char* group, std::string name, CheckStatus status, std::string value, std::string detail) {
  return Check{group, std::move(name), status, std::move(value), std::move(detail)};
}


// ---- host -----------------------------------------------------------------------------------

Check check_driver(const DoctorFacts& f) {
  const bool from_proc = !f.proc_driver.empty();
  const std::string v = from_proc ? f.proc_driver : f.nvml.driver_version;
  const std::string source = from_proc ? "/proc/driver/nvidia/version" : "NVML";
  if (v.empty())
    return make("host", "driver", f.gpu_expected ? CheckStatus::fail : CheckStatus::skip, "",
                cat("no NVIDIA driver: /proc/driver/nvidia/version is missing and NVML says: ",
                    f.nvml.error.empty() ? "no version" : f.nvml.error, f.gpu_expected ? "" : "; " + f.no_gpu_reason));
  const std::string cuda = f.cuda.driver_version.empty() ? "" : cat("; it supports CUDA ", f.cuda.driver_version);
  if (!f.gpu_expected) return make("host", "driver", CheckStatus::skip, v, cat("NVIDIA driver ", v, " (", source, ")", "; ", f.no_gpu_reason));
  if (compare_versions(v, kMinDriverVersion) < 0)
    return make("host", "driver", CheckStatus::fail, v,
                cat("NVIDIA driver ", v, " (", source, ") is older than ", kMinDriverVersion,
                    ": update the node's driver (the CUDA toolkit in the image needs at least that)", cuda));
  return make("host", "driver", CheckStatus::pass, v,
              cat("NVIDIA driver ", v, " (", source, ") >= ", kMinDriverVersion, cuda));
}

std::string gpu_names(const CudaReport& c) {
  std::vector<std::string> names = c.names;
  if (!names.empty() && std::all_of(names.begin(), names.end(), [&](const std::string& n) { return n == names[0]; }))
    return cat(names.size(), " x ", names[0]);
  return join(names, ", ");
}

std::string gpus_visible(int n) { return cat(n, n == 1 ? " GPU visible" : " GPUs visible"); }

Check check_gpus(const DoctorFacts& f) {
  const int n = f.cuda.device_count;
  if (!f.gpu_expected)
    return make("host", "gpus", CheckStatus::skip, std::to_string(n), cat(gpus_visible(n), "; ", f.no_gpu_reason));
  if (n <= 0)
    return make("host", "gpus", CheckStatus::fail, "0",
                cat("no usable GPU: ", f.cuda.error.empty() ? "no CUDA device" : f.cuda.error,
                    " (check the driver, CUDA_VISIBLE_DEVICES and --gpus-per-node)"));
  if (f.expected_gpus > 0 && n != f.expected_gpus)
    return make("host", "gpus", CheckStatus::fail, std::to_string(n),
                cat(gpus_visible(n), ", expected ", f.expected_gpus,
                    " (SLURM_GPUS_ON_NODE or ME_DOCTOR_GPUS): check CUDA_VISIBLE_DEVICES and --gpus-per-node; ",
                    gpu_names(f.cuda)));
  return make("host", "gpus", CheckStatus::pass, std::to_string(n),
              cat(gpu_names(f.cuda), f.expected_gpus > 0 ? cat(", as expected (", f.expected_gpus, ")") : ""));
}

Check check_nvlink(const DoctorFacts& f) {
  const int n = f.cuda.device_count;
  if (!f.gpu_expected) return make("host", "nvlink", CheckStatus::skip, "", cat("peer access not checked", "; ", f.no_gpu_reason));
  if (n < 2) return make("host", "nvlink", CheckStatus::skip, "", cat(gpus_visible(n), ": no peers to reach"));
  std::vector<std::string> missing;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const bool yes = i < (int)f.cuda.peer.size() && j < (int)f.cuda.peer[i].size() && f.cuda.peer[i][j];
      if (i != j && !yes) missing.push_back(cat("GPU", i, "->GPU", j));
    }
  if (!missing.empty())
    return make("host", "nvlink", CheckStatus::fail, "",
                cat("no peer access for ", join(missing, ", "),
                    ": NCCL goes through host memory between them; see nvidia-smi topo -m, and on NVSwitch "
                    "systems (p5, DGX H100) that nvidia-fabricmanager runs"));
  std::string links = "NVLink state unknown (NVML: " + (f.nvml.error.empty() ? std::string("not loaded") : f.nvml.error) + ")";
  if (f.nvml.found && !f.nvml.active_links.empty()) {
    const auto [lo, hi] = std::minmax_element(f.nvml.active_links.begin(), f.nvml.active_links.end());
    if (*hi == 0)
      return make("host", "nvlink", CheckStatus::fail, "0",
                  cat("all ", n, " GPUs reach each other, but over PCIe: NVML sees no active NVLink "
                      "(tensor parallelism needs NVLink; see nvidia-smi nvlink --status)"));
    links = *lo == *hi ? cat(*lo, " active NVLinks per GPU") : cat(*lo, " to ", *hi, " active NVLinks per GPU");
  }
  return make("host", "nvlink", CheckStatus::pass, std::to_string(n * (n - 1)),
              cat("all ", n * (n - 1), " GPU pairs have peer access; ", links));
}

Check check_efa_host(const DoctorFacts& f) {
  const auto& d = f.efa_devices;
  if (d.empty())
    return make("host", "efa", CheckStatus::skip, "0",
                "no EFA device in /sys/class/infiniband: one node only, or traffic between nodes goes over TCP");
  const std::string devs = cat(d.size(), " EFA devices (", d.front(), d.size() > 1 ? ", ..." : "", ")");
  if (f.efa_installer.empty())
    return make("host", "efa", CheckStatus::pass, std::to_string(d.size()),
                cat(devs, "; EFA installer version unknown (no /opt/amazon/efa_installed_packages, "
                          "as inside a container)"));
  if (compare_versions(f.efa_installer, kMinEfaInstaller) < 0)
    return make("host", "efa", CheckStatus::fail, f.efa_installer,
                cat(devs, "; EFA installer ", f.efa_installer, " is older than ", kMinEfaInstaller,
                    ": update the EFA software on the node"));
  return make("host", "efa", CheckStatus::pass, f.efa_installer,
              cat(devs, "; EFA installer ", f.efa_installer, " >= ", kMinEfaInstaller));
}

Check check_dir(const DoctorFacts& f, const DirFact& d) {
  const auto& p = d.probe;
  if (!p.exists) {
    if (d.named || f.under_slurm)
      return make("host", d.path, CheckStatus::fail, "",
                  cat("does not exist (", p.error, "): mount it on every node (FSx for Lustre at /fsx, the "
                      "NVMe RAID at /scratch), or name the directories to check in ME_DOCTOR_PATHS"));
    return make("host", d.path, CheckStatus::skip, "",
                "does not exist here (not a cluster node; ME_DOCTOR_PATHS=dir1:dir2 names others to check)");
  }
  if (!p.is_dir) return make("host", d.path, CheckStatus::fail, "", "exists but is not a directory");
  if (!p.writable) return make("host", d.path, CheckStatus::fail, human_bytes(p.free_bytes), cat("not writable: ", p.error));
  if (p.free_bytes < f.min_free_bytes)
    return make("host", d.path, CheckStatus::fail, human_bytes(p.free_bytes),
                cat("writable, but only ", human_bytes(p.free_bytes), " free, less than ",
                    human_bytes(f.min_free_bytes), " (ME_DOCTOR_MIN_FREE_GB)"));
  return make("host", d.path, CheckStatus::pass, human_bytes(p.free_bytes),
              cat("writable, ", human_bytes(p.free_bytes), " free"));
}

}  // namespace

namespace doctor_detail {
std::vector<Check> container_checks(const DoctorFacts& f);  // doctor_checks_container.cpp
}

const char* status_name(CheckStatus s) {
  switch (s) {
    case CheckStatus::pass: return "pass";
    case CheckStatus::fail: return "fail";
    case CheckStatus::skip: return "skip";
  }
  return "?";
}

std::vector<Check> run_checks(const DoctorFacts& f) {
  std::vector<Check> out = {check_driver(f), check_gpus(f), check_nvlink(f), check_efa_host(f)};
  for (const auto& d : f.dirs) out.push_back(check_dir(f, d));
  for (auto& c : doctor_detail::container_checks(f)) out.push_back(std::move(c));
  return out;
}

DoctorFacts gather_facts(const SystemView& sys, bool gpu_build) {
  DoctorFacts f;
  f.gpu_expected = gpu_build;
  f.no_gpu_reason = "this megaengine is a CPU build (LibTorch without CUDA), so GPU checks do not apply";
  f.under_slurm = sys.getenv("SLURM_JOB_ID") != nullptr;
  for (const char* name : {"ME_DOCTOR_GPUS", "SLURM_GPUS_ON_NODE"})
    if (const char* v = sys.getenv(name); v && *v) {
      f.expected_gpus = std::max(0, std::atoi(v));
      break;
    }
  if (const char* v = sys.getenv("ME_DOCTOR_GPUS"); gpu_build && v && std::string(v) == "0") {
    f.gpu_expected = false;
    f.no_gpu_reason = "ME_DOCTOR_GPUS=0 says this machine has no GPU, so GPU checks do not apply";
  }
  f.proc_driver = driver_version_from_proc(sys.read_file("/proc/driver/nvidia/version").value_or(""));
  f.efa_devices = efa_devices(sys);
  f.efa_installer = efa_installer_version(sys.read_file("/opt/amazon/efa_installed_packages").value_or(""));
  f.plugin = find_ofi_nccl_plugin(sys);
  f.toolkit = find_cuda_toolkit(sys);
  for (const auto& [k, v] : sys.env)
    if (k.rfind("FI_", 0) == 0 || k.rfind("NCCL_", 0) == 0) f.fi_nccl_env.emplace_back(k, v);
  f.net_interfaces = sys.list_dir("/sys/class/net");
  if (const char* paths = sys.getenv("ME_DOCTOR_PATHS"); paths && *paths) {
    for (const auto& p : split_nonempty(paths, ':')) f.dirs.push_back({p, true, sys.probe_dir(p)});
  } else {
    for (const char* p : {"/fsx", "/scratch"}) f.dirs.push_back({p, false, sys.probe_dir(p)});
  }
  if (const char* gb = sys.getenv("ME_DOCTOR_MIN_FREE_GB"); gb && *gb)
    f.min_free_bytes = static_cast<uint64_t>(std::max(0.0, std::atof(gb)) * (1ull << 30));
  return f;
}

std::string format_checks(const std::vector<Check>& checks) {
  std::ostringstream os;
  std::string group;
  for (const auto& c : checks) {
    if (c.group != group) {
      group = c.group;
      os << group << " checklist\n";
    }
    std::string status = status_name(c.status);
    std::transform(status.begin(), status.end(), status.begin(), ::toupper);
    char name[32];
    std::snprintf(name, sizeof name, "%-14s", c.name.c_str());
    os << "  " << status << "  " << name << " " << c.detail << "\n";
  }
  int n[3] = {0, 0, 0};
  for (const auto& c : checks) ++n[static_cast<int>(c.status)];
  os << "doctor: " << n[0] << " passed, " << n[1] << " failed, " << n[2] << " skipped; exit status "
     << doctor_exit_status(checks) << "\n";
  return os.str();
}

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (ch < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

std::string checks_json(const std::vector<Check>& checks, const std::vector<std::pair<std::string, std::string>>& header) {
  int n[3] = {0, 0, 0};
  for (const auto& c : checks) ++n[static_cast<int>(c.status)];
  std::ostringstream os;
  os << "{\n  \"header\": {";
  for (size_t i = 0; i < header.size(); ++i)
    os << (i ? ", " : "") << json_quote(header[i].first) << ": " << json_quote(header[i].second);
  os << "},\n  \"status\": " << json_quote(n[1] ? "fail" : "pass") << ", \"passed\": " << n[0]
     << ", \"failed\": " << n[1] << ", \"skipped\": " << n[2] << ",\n  \"checks\": [";
  for (size_t i = 0; i < checks.size(); ++i) {
    const auto& c = checks[i];
    os << (i ? ",\n" : "\n") << "    {\"group\": " << json_quote(c.group) << ", \"name\": " << json_quote(c.name)
       << ", \"status\": " << json_quote(status_name(c.status)) << ", \"value\": " << json_quote(c.value)
       << ", \"detail\": " << json_quote(c.detail) << "}";
  }
  os << "\n  ]\n}\n";
  return os.str();
}

int doctor_exit_status(const std::vector<Check>& checks) {
  return std::any_of(checks.begin(), checks.end(), [](const Check& c) { return c.status == CheckStatus::fail; }) ? 1 : 0;
}

}  // namespace me::doctor
