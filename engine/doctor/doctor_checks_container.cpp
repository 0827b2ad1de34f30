// The container checklist of `megaengine doctor`: CUDA toolkit, NCCL, aws-ofi-nccl, libfabric and
// the FI_ / NCCL_ variables. See doctor_checks.h for the status rules.
#include <algorithm>
#include <sstream>

#include "engine/doctor/doctor_checks.h"
#include "engine/core/strings.h"
#include "engine/core/error.h"

namespace me::doctor {
namespace {

constexpr const char* kEfaLib = "/opt/amazon/efa/lib";

Check make(std::string name, CheckStatus status, std::string value, std::string detail) {
  return Check{"container", std::move(name), status, std::move(value), std::move(detail)};
}

const std::string* env_value(const DoctorFacts& f, const std::string& name) {
  for (const auto& [k, v] : f.fi_nccl_env)
    if (k == name) return &v;
  return nullptr;
}

std::string env_listing(const DoctorFacts& f, const std::string& prefix) {
  std::vector<std::string> items;
  for (const auto& [k, v] : f.fi_nccl_env)
    if (k.rfind(prefix, 0) == 0) items.push_back(k + "=" + v);
  return items.empty() ? "none set" : join(items, " ");
}

size_t env_count(const DoctorFacts& f, const std::string& prefix) {
  return static_cast<size_t>(std::count_if(f.fi_nccl_env.begin(), f.fi_nccl_env.end(),
                                           [&](const auto& kv) { return kv.first.rfind(prefix, 0) == 0; }));
}

// libfabric's FI_PROVIDER: "efa", "efa,shm", or "^tcp,udp" (all but those).
bool provider_list_allows_efa(const std::string& list) {
  const bool exclude = !list.empty() && list[0] == '^';
  const auto names = split_nonempty(exclude ? list.substr(1) : list, ',');
  const bool listed = std::find(names.begin(), names.end(), "efa") != names.end();
  return exclude ? !listed : listed;
}

// NCCL_SOCKET_IFNAME: comma-separated prefixes, "=" for exact names, "^" to exclude.
bool socket_ifname_matches(const std::string& spec, const std::vector<std::string>& interfaces) {
  std::string s = spec;
  const bool exclude = !s.empty() && s[0] == '^';
  if (exclude) s = s.substr(1);
  const bool exact = !s.empty() && s[0] == '=';
  if (exact) s = s.substr(1);
  const auto patterns = split_nonempty(s, ',');
  return std::any_of(interfaces.begin(), interfaces.end(), [&](const std::string& ifc) {
    const bool hit = std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) {
      return exact ? ifc == p : ifc.rfind(p, 0) == 0;
    });
    return exclude ? !hit : hit;
  });
}

Check check_toolkit(const DoctorFacts& f) {
  const auto& t = f.toolkit;
  if (!f.gpu_expected)
    return make("cuda-toolkit", CheckStatus::skip, t.version,
                cat(t.version.empty() ? "none at " + t.path : "CUDA toolkit " + t.version + " (" + t.path + ")", "; ", f.no_gpu_reason));
  if (t.version.empty())
    return make("cuda-toolkit", CheckStatus::fail, "",
                cat("no CUDA toolkit version at ", t.path, ": set CUDA_HOME to the toolkit this megaengine was built with"));
  // The driver runs toolkits up to the CUDA version it reports (13000 -> 13.0).
  const int major = std::atoi(t.version.c_str());
  const auto dot = t.version.find('.');
  const int minor = dot == std::string::npos ? 0 : std::atoi(t.version.c_str() + dot + 1);
  const int code = major * 1000 + minor * 10;
  if (f.cuda.driver_version_code > 0 && code > f.cuda.driver_version_code)
    return make("cuda-toolkit", CheckStatus::fail, t.version,
                cat("CUDA toolkit ", t.version, " (", t.path, ") is newer than the driver supports (CUDA ",
                    f.cuda.driver_version, "): update the node's driver, or build the image on an older CUDA"));
  return make("cuda-toolkit", CheckStatus::pass, t.version,
              cat("CUDA toolkit ", t.version, " (", t.path, ")",
                  f.cuda.driver_version.empty() ? std::string("; the driver's CUDA version is unknown")
                                                : "; the driver supports CUDA " + f.cuda.driver_version));
}

Check check_nccl(const DoctorFacts& f) {
  const auto& n = f.nccl;
  if (n.found && n.error.empty()) return make("nccl", CheckStatus::pass, n.version, cat("NCCL ", n.version, " (", n.library, ")"));
  const std::string why = n.found ? cat(n.library, ": ", n.error) : n.error;
  if (!f.gpu_expected) return make("nccl", CheckStatus::skip, "", cat("not usable: ", why, "; ", f.no_gpu_reason));
  return make("nccl", CheckStatus::fail, "", cat("not usable: ", why, " (install libnccl2, or put its directory in LD_LIBRARY_PATH)"));
}

Check check_ofi_plugin(const DoctorFacts& f) {
  const auto& p = f.plugin;
  const bool efa = !f.efa_devices.empty();
  const std::string version = p.version.empty() ? "version unknown" : p.version;
  if (!p.disabled_by.empty())
    return make("aws-ofi-nccl", efa ? CheckStatus::fail : CheckStatus::skip, "",
                cat(p.disabled_by, ": NCCL loads no network plugin", efa ? ", so it cannot use EFA: unset it" : "; no EFA device here"));
  if (!p.path.empty() && p.on_loader_path)
    return make("aws-ofi-nccl", CheckStatus::pass, p.version, cat("aws-ofi-nccl ", version, " (", p.path, ")"));
  if (!p.path.empty()) {
    const std::string dir = p.path.substr(0, p.path.find_last_of('/'));
    return make("aws-ofi-nccl", efa ? CheckStatus::fail : CheckStatus::skip, p.version,
                cat("aws-ofi-nccl ", version, " is at ", p.path, " but not on the loader's path, so NCCL will not load it",
                    efa ? cat(": export LD_LIBRARY_PATH=", dir, ":$LD_LIBRARY_PATH") : std::string("; no EFA device here")));
  }
  if (efa)
    return make("aws-ofi-nccl", CheckStatus::fail, "",
                "not found (libnccl-net-ofi.so / libnccl-net.so in LD_LIBRARY_PATH): NCCL would fall back to TCP "
                "sockets between nodes; the image from container/Dockerfile has it in /opt/amazon/ofi-nccl");
  return make("aws-ofi-nccl", CheckStatus::skip, "", "not found; no EFA device here, so NCCL needs no network plugin");
}

Check check_libfabric(const DoctorFacts& f) {
  const auto& fb = f.fabric;
  const std::string providers = fb.providers.empty() ? "none" : join(fb.providers, ", ");
  const std::string found = cat("libfabric ", fb.version, " (", fb.library, "), providers: ", providers);
  if (f.efa_devices.empty())
    return make("libfabric", CheckStatus::skip, fb.version,
                cat(fb.found ? found : "not found", "; no EFA device here, so the efa provider is not needed"));
  if (!fb.found)
    return make("libfabric", CheckStatus::fail, "",
                cat("not found (", fb.error, "): put ", kEfaLib, " first in LD_LIBRARY_PATH"));
  if (!fb.has_efa)
    return make("libfabric", CheckStatus::fail, fb.version,
                cat(found, ": no efa provider although the node has EFA devices; put ", kEfaLib,
                    " first in LD_LIBRARY_PATH (AWS's libfabric carries efa)"));
  return make("libfabric", CheckStatus::pass, fb.version, found);
}

Check check_fi_env(const DoctorFacts& f) {
  const bool efa = !f.efa_devices.empty();
  const std::string listing = env_listing(f, "FI_");
  const std::string count = std::to_string(env_count(f, "FI_"));
  const std::string* provider = env_value(f, "FI_PROVIDER");
  if (efa && provider && !provider_list_allows_efa(*provider))
    return make("fi-env", CheckStatus::fail, count, cat("FI_PROVIDER=", *provider, " keeps libfabric off EFA: set FI_PROVIDER=efa; ", listing));
  if (!efa && provider && provider_list_allows_efa(*provider) && (*provider)[0] != '^')
    return make("fi-env", CheckStatus::fail, count,
                cat("FI_PROVIDER=", *provider, " but this machine has no EFA device, so libfabric finds no provider: "
                    "unset it here (slurm/train.sbatch sets it only where ", kEfaLib, " exists); ", listing));
  if (const std::string* rdma = env_value(f, "FI_EFA_USE_DEVICE_RDMA"); efa && rdma && *rdma == "0")
    return make("fi-env", CheckStatus::fail, count, cat("FI_EFA_USE_DEVICE_RDMA=0 turns GPUDirect RDMA off: set it to 1; ", listing));
  return make("fi-env", CheckStatus::pass, count, listing);
}

Check check_nccl_env(const DoctorFacts& f) {
  const std::string listing = env_listing(f, "NCCL_");
  const std::string count = std::to_string(env_count(f, "NCCL_"));
  if (const std::string* p2p = env_value(f, "NCCL_P2P_DISABLE"); p2p && *p2p == "1" && f.cuda.device_count > 1)
    return make("nccl-env", CheckStatus::fail, count, cat("NCCL_P2P_DISABLE=1 keeps NCCL off NVLink between this node's GPUs: unset it; ", listing));
  if (const std::string* ifname = env_value(f, "NCCL_SOCKET_IFNAME");
      ifname && !f.net_interfaces.empty() && !socket_ifname_matches(*ifname, f.net_interfaces))
    return make("nccl-env", CheckStatus::fail, count,
                cat("NCCL_SOCKET_IFNAME=", *ifname, " matches none of this machine's interfaces (",
                    join(f.net_interfaces, ", "), "): NCCL cannot bootstrap; ", listing));
  if (const std::string* net = env_value(f, "NCCL_NET"); net && !f.efa_devices.empty() && *net == "Socket")
    return make("nccl-env", CheckStatus::fail, count, cat("NCCL_NET=Socket keeps NCCL off EFA: unset it; ", listing));
  return make("nccl-env", CheckStatus::pass, count, listing);
}

}  // namespace

namespace doctor_detail {
std::vector<Check> container_checks(const DoctorFacts& f) {
  return {check_toolkit(f), check_nccl(f), check_ofi_plugin(f), check_libfabric(f), check_fi_env(f), check_nccl_env(f)};
}
}  // namespace doctor_detail

}  // namespace me::doctor
