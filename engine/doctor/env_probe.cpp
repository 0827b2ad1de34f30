// Environment probes for `megaengine doctor`: dlopen/dlsym only, no build-time dependency on
// libfabric, NCCL or CUDA. See env_probe.h.
//
// Handles are never dlclose'd: libfabric loads provider plugins and registers destructors,
// and libcuda/NCCL keep threads and state alive after their first call; unloading either
// under them is a known way to crash at exit. A doctor run opens each library once.
#include "engine/doctor/env_probe.h"
#include "engine/core/strings.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <sstream>

#include "engine/core/error.h"

namespace me::doctor {
namespace {

// ---- libfabric ABI (declared here, not included: no build-time dependency) ------------------
//
// ABI assumption, checked against /usr/include/rdma/fabric.h of libfabric 1.17 (Debian 12):
//   uint32_t fi_version(void);                        // FI_VERSION(major, minor) = major<<16 | minor
//   int  fi_getinfo(uint32_t version, const char* node, const char* service, uint64_t flags,
//                   const struct fi_info* hints, struct fi_info** info);   // 0 or -FI_Exxx
//   void fi_freeinfo(struct fi_info* info);
//   const char* fi_strerror(int errnum);              // takes the positive error number
// We read only two fields of fi_info (`next`, `fabric_attr`) and one of fi_fabric_attr
// (`prov_name`); the structs below reproduce every member up to those, with the same types,
// so the offsets match (LP64: next@0, fabric_attr@104, prov_name@16, as offsetof gives on
// the real header; the static_asserts below pin them). This prefix has been identical since
// libfabric 1.0: later releases only appended members (fi_info::nic and
// fi_fabric_attr::api_version, both in 1.5). libfabric versions its symbols
// (fi_getinfo@FABRIC_1.0..1.3, default FABRIC_1.3 in 1.17) and keeps the old ones for old
// struct layouts; we ask for FABRIC_1.3 explicitly with dlvsym and fall back to the default
// dlsym binding only for an unversioned build. fi_getinfo and fi_freeinfo are always taken
// from the same version so the list is freed by the code that built it.
struct fi_fabric_attr_prefix {
  void* fabric;      // struct fid_fabric*
  char* name;
  char* prov_name;
  uint32_t prov_version;
  // uint32_t api_version (1.5+): not read
};

struct fi_info_prefix {
  fi_info_prefix* next;
  uint64_t caps;
  uint64_t mode;
  uint32_t addr_format;
  size_t src_addrlen;
  size_t dest_addrlen;
  void* src_addr;
  void* dest_addr;
  void* handle;       // fid_t
  void* tx_attr;      // struct fi_tx_attr*
  void* rx_attr;      // struct fi_rx_attr*
  void* ep_attr;      // struct fi_ep_attr*
  void* domain_attr;  // struct fi_domain_attr*
  fi_fabric_attr_prefix* fabric_attr;
  // struct fid_nic* nic (1.5+): not read
};
static_assert(sizeof(void*) != 8 || offsetof(fi_info_prefix, fabric_attr) == 104,
              "fi_info layout differs from libfabric's on LP64");
static_assert(sizeof(void*) != 8 || offsetof(fi_fabric_attr_prefix, prov_name) == 16,
              "fi_fabric_attr layout differs from libfabric's on LP64");

using fi_version_fn = uint32_t (*)();
using fi_getinfo_fn = int (*)(uint32_t, const char*, const char*, uint64_t, const void*,
                              fi_info_prefix**);
using fi_freeinfo_fn = void (*)(fi_info_prefix*);
using fi_strerror_fn = const char* (*)(int);

// ---- NCCL ABI: ncclResult_t ncclGetVersion(int* version); ncclResult_t is a C enum (int),
// ncclSuccess = 0. const char* ncclGetErrorString(ncclResult_t) exists since 2.4 (optional).
using nccl_get_version_fn = int (*)(int*);
using nccl_error_string_fn = const char* (*)(int);

// ---- CUDA driver ABI (cuda.h): CUresult is a C enum (int, CUDA_SUCCESS = 0), CUdevice is int.
// None of these entry points is redirected to a _v2 name by cuda.h's macros.
using cu_init_fn = int (*)(unsigned int);
using cu_driver_get_version_fn = int (*)(int*);
using cu_device_get_count_fn = int (*)(int*);
using cu_device_get_fn = int (*)(int*, int);
using cu_device_get_name_fn = int (*)(char*, int, int);
using cu_device_can_access_peer_fn = int (*)(int*, int, int);
using cu_get_error_fn = int (*)(int, const char**);

// ---- NVML ABI (nvml.h): nvmlReturn_t is a C enum (int, NVML_SUCCESS = 0), nvmlDevice_t an
// opaque pointer, nvmlEnableState_t an enum (NVML_FEATURE_ENABLED = 1). The _v2 entry points are
// what nvml.h's macros select for nvmlInit / DeviceGetCount / DeviceGetHandleByIndex.
using nvml_init_fn = int (*)();
using nvml_shutdown_fn = int (*)();
using nvml_driver_version_fn = int (*)(char*, unsigned int);
using nvml_device_count_fn = int (*)(unsigned int*);
using nvml_device_handle_fn = int (*)(unsigned int, void**);
using nvml_nvlink_state_fn = int (*)(void*, unsigned int, int*);
using nvml_error_string_fn = const char* (*)(int);
constexpr unsigned kNvmlMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS (H100: 18 links)

std::string dl_error(const char* fallback) {
  const char* e = dlerror();
  return e ? std::string(e) : std::string(fallback);
}

// Opens `library`; on success returns the handle and sets `path` to the file actually loaded.
void* open_library(const std::string& library, std::string& path, std::string& error) {
  dlerror();  // clear
  void* h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    error = dl_error(me::cat("dlopen(", library, ") failed").c_str());
    return nullptr;
  }
  path = library;
  struct link_map* lm = nullptr;
  if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
    path = lm->l_name;
  return h;
}

template <typename F>
F symbol(void* h, const char* name, std::string& error) {
  dlerror();
  void* p = dlsym(h, name);
  if (!p) {
    error = dl_error(me::cat("symbol ", name, " not found").c_str());
    return nullptr;
  }
  return reinterpret_cast<F>(p);
}

template <typename F>
F versioned_symbol(void* h, const char* name, const char* version) {
  dlerror();
  return reinterpret_cast<F>(dlvsym(h, name, version));
}

// Names for the codes a doctor meets most, for drivers (the stub) whose cuGetErrorName fails.
const char* cu_known_error(int code) {
  switch (code) {
    case 3: return "CUDA_ERROR_NOT_INITIALIZED";
    case 34: return "CUDA_ERROR_STUB_LIBRARY (libcuda is the toolkit's stub, not the driver's)";
    case 46: return "CUDA_ERROR_DEVICE_UNAVAILABLE (GPU busy or in exclusive mode)";
    case 100: return "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)";
    case 304: return "CUDA_ERROR_OPERATING_SYSTEM";
    case 801: return "CUDA_ERROR_NOT_SUPPORTED";
    case 802: return "CUDA_ERROR_SYSTEM_NOT_READY (fabric manager not running?)";
    case 803: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (libcuda and kernel driver versions differ)";
    case 804: return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
    default: return nullptr;
  }
}

std::string cu_error_text(void* h, int code) {
  std::string name, text;
  const char* s = nullptr;
  if (auto f = reinterpret_cast<cu_get_error_fn>(dlsym(h, "cuGetErrorName")); f && f(code, &s) == 0 && s)
    name = s;
  s = nullptr;
  if (auto f = reinterpret_cast<cu_get_error_fn>(dlsym(h, "cuGetErrorString")); f && f(code, &s) == 0 && s)
    text = s;
  if (name.empty()) {
    const char* k = cu_known_error(code);
    return k ? me::cat(k, " [CUresult ", code, "]") : me::cat("CUresult ", code);
  }
  return text.empty() ? name : me::cat(name, " (", text, ")");
}

const char* kEfaHint =
    "AWS EFA nodes ship their own libfabric under /opt/amazon/efa/lib: put it first in "
    "LD_LIBRARY_PATH";

}  // namespace

FabricReport probe_libfabric(const std::string& library) {
  FabricReport r;
  r.library = library;
  void* h = open_library(library, r.library, r.error);
  if (!h) return r;

  auto version = symbol<fi_version_fn>(h, "fi_version", r.error);
  if (!version) return r;
  // Same symbol version for both, see the ABI note above.
  auto getinfo = versioned_symbol<fi_getinfo_fn>(h, "fi_getinfo", "FABRIC_1.3");
  auto freeinfo = versioned_symbol<fi_freeinfo_fn>(h, "fi_freeinfo", "FABRIC_1.3");
  if (!getinfo || !freeinfo) {
    getinfo = symbol<fi_getinfo_fn>(h, "fi_getinfo", r.error);
    freeinfo = symbol<fi_freeinfo_fn>(h, "fi_freeinfo", r.error);
    if (!getinfo || !freeinfo) return r;
  }
  auto strerror_ = reinterpret_cast<fi_strerror_fn>(dlsym(h, "fi_strerror"));

  r.found = true;
  const uint32_t v = version();
  r.version = me::cat(v >> 16, ".", v & 0xFFFF);

  // Ask with the library's own API version (>= 1.5 everywhere that matters); no hints: every
  // provider reports every fabric/domain it can serve.
  const uint32_t want = std::max<uint32_t>(v, (1u << 16) | 5u);
  fi_info_prefix* info = nullptr;
  const int rc = getinfo(want, nullptr, nullptr, 0, nullptr, &info);
  if (rc != 0) {
    const int err = rc < 0 ? -rc : rc;
    const char* s = strerror_ ? strerror_(err) : nullptr;
    r.error = me::cat("fi_getinfo failed: ", s ? s : "", " (", rc, ")");
    return r;
  }
  std::set<std::string> names;
  for (fi_info_prefix* i = info; i; i = i->next) {
    if (!i->fabric_attr || !i->fabric_attr->prov_name) continue;
    // Layered providers read "tcp;ofi_rxm": list each part.
    std::stringstream ss(i->fabric_attr->prov_name);
    std::string part;
    while (std::getline(ss, part, ';'))
      if (!part.empty()) names.insert(part);
  }
  if (info) freeinfo(info);
  r.providers.assign(names.begin(), names.end());  // std::set: unique and sorted
  r.has_efa = names.count("efa") > 0;
  return r;
}

std::string nccl_version_string(int code) {
  if (code <= 0) return "unknown";
  if (code >= 10000)  // NCCL_VERSION(X,Y,Z) for 2.9+: X*10000 + Y*100 + Z
    return me::cat(code / 10000, ".", (code % 10000) / 100, ".", code % 100);
  return me::cat(code / 1000, ".", (code % 1000) / 100, ".", code % 100);  // <= 2.8
}

std::string cuda_version_string(int code) {
  if (code <= 0) return "unknown";
  return me::cat(code / 1000, ".", (code % 1000) / 10);
}

NcclReport probe_nccl(const std::string& library) {
  NcclReport r;
  r.library = library;
  void* h = open_library(library, r.library, r.error);
  if (!h) return r;
  auto get_version = symbol<nccl_get_version_fn>(h, "ncclGetVersion", r.error);
  if (!get_version) return r;
  r.found = true;
  int code = 0;
  const int rc = get_version(&code);
  if (rc != 0) {
    auto es = reinterpret_cast<nccl_error_string_fn>(dlsym(h, "ncclGetErrorString"));
    const char* s = es ? es(rc) : nullptr;
    r.error = me::cat("ncclGetVersion failed: ", s ? s : "", " (ncclResult_t ", rc, ")");
    r.version = "unknown";
    return r;
  }
  r.version_code = code;
  r.version = nccl_version_string(code);
  return r;
}

CudaReport probe_cuda(const std::string& library) {
  CudaReport r;
  r.library = library;
  void* h = open_library(library, r.library, r.error);
  if (!h) return r;
  auto init = symbol<cu_init_fn>(h, "cuInit", r.error);
  auto driver_version = init ? symbol<cu_driver_get_version_fn>(h, "cuDriverGetVersion", r.error) : nullptr;
  auto get_count = driver_version ? symbol<cu_device_get_count_fn>(h, "cuDeviceGetCount", r.error) : nullptr;
  auto get = get_count ? symbol<cu_device_get_fn>(h, "cuDeviceGet", r.error) : nullptr;
  auto get_name = get ? symbol<cu_device_get_name_fn>(h, "cuDeviceGetName", r.error) : nullptr;
  auto can_peer = get_name ? symbol<cu_device_can_access_peer_fn>(h, "cuDeviceCanAccessPeer", r.error) : nullptr;
  if (!can_peer) return r;
  r.found = true;

  // cuDriverGetVersion works without cuInit, so the driver version is known even with no GPU.
  int v = 0;
  if (driver_version(&v) == 0) {
    r.driver_version_code = v;
    r.driver_version = cuda_version_string(v);
  } else {
    r.driver_version = "unknown";
  }

  if (int rc = init(0); rc != 0) {
    r.error = me::cat("cuInit(0) failed: ", cu_error_text(h, rc));
    return r;
  }
  int n = 0;
  if (int rc = get_count(&n); rc != 0) {
    r.error = me::cat("cuDeviceGetCount failed: ", cu_error_text(h, rc));
    return r;
  }
  if (n <= 0) {
    r.error = "cuDeviceGetCount: no CUDA device";
    return r;
  }
  r.device_count = n;
  std::vector<int> dev(n, -1);
  for (int i = 0; i < n; ++i) {
    char buf[256] = {0};
    if (int rc = get(&dev[i], i); rc != 0) {
      r.names.push_back(me::cat("(cuDeviceGet failed: ", cu_error_text(h, rc), ")"));
      continue;
    }
    if (int rc = get_name(buf, sizeof buf - 1, dev[i]); rc != 0)
      r.names.push_back(me::cat("(cuDeviceGetName failed: ", cu_error_text(h, rc), ")"));
    else
      r.names.push_back(buf);
  }
  r.peer.assign(n, std::vector<bool>(n, false));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      if (i == j || dev[i] < 0 || dev[j] < 0) continue;
      int can = 0;
      r.peer[i][j] = can_peer(&can, dev[i], dev[j]) == 0 && can != 0;
    }
  return r;
}

NvmlReport probe_nvml(const std::string& library) {
  NvmlReport r;
  r.library = library;
  void* h = open_library(library, r.library, r.error);
  if (!h) return r;
  auto init = symbol<nvml_init_fn>(h, "nvmlInit_v2", r.error);
  auto shutdown = init ? symbol<nvml_shutdown_fn>(h, "nvmlShutdown", r.error) : nullptr;
  auto driver = shutdown ? symbol<nvml_driver_version_fn>(h, "nvmlSystemGetDriverVersion", r.error) : nullptr;
  auto count = driver ? symbol<nvml_device_count_fn>(h, "nvmlDeviceGetCount_v2", r.error) : nullptr;
  auto handle = count ? symbol<nvml_device_handle_fn>(h, "nvmlDeviceGetHandleByIndex_v2", r.error) : nullptr;
  if (!handle) return r;
  auto link_state = reinterpret_cast<nvml_nvlink_state_fn>(dlsym(h, "nvmlDeviceGetNvLinkState"));
  auto error_string = reinterpret_cast<nvml_error_string_fn>(dlsym(h, "nvmlErrorString"));
  auto text = [&](int rc) { return error_string && error_string(rc) ? std::string(error_string(rc)) : me::cat("nvmlReturn_t ", rc); };
  if (int rc = init(); rc != 0) {
    r.error = me::cat("nvmlInit failed: ", text(rc));
    return r;
  }
  r.found = true;
  char buf[96] = {0};
  if (int rc = driver(buf, sizeof buf - 1); rc == 0) r.driver_version = buf;
  else r.error = me::cat("nvmlSystemGetDriverVersion failed: ", text(rc));
  unsigned n = 0;
  if (int rc = count(&n); rc != 0) {
    r.error = me::cat("nvmlDeviceGetCount failed: ", text(rc));
    n = 0;
  }
  for (unsigned i = 0; i < n; ++i) {
    void* dev = nullptr;
    int active = 0;
    if (handle(i, &dev) == 0 && link_state)
      for (unsigned link = 0; link < kNvmlMaxLinks; ++link) {
        int state = 0;
        // Links past the device's last answer INVALID_ARGUMENT; no NVLink at all: NOT_SUPPORTED.
        if (link_state(dev, link, &state) == 0 && state == 1) ++active;
      }
    r.active_links.push_back(active);
  }
  shutdown();
  return r;
}

std::string format_report(const FabricReport& fabric, const NcclReport& nccl, const CudaReport& cuda) {
  std::ostringstream os;

  // NCCL
  os << "NCCL:       ";
  if (!nccl.found)
    os << "not found: " << nccl.error << "\n";
  else if (!nccl.error.empty())
    os << "version unknown (" << nccl.library << "): " << nccl.error << "\n";
  else
    os << nccl.version << " (" << nccl.library << ")\n";

  // CUDA
  os << "CUDA:       ";
  const std::string drv = cuda.driver_version.empty() ? "unknown" : cuda.driver_version;
  if (!cuda.found) {
    os << "not found: " << cuda.error << "\n";
  } else if (cuda.device_count <= 0) {
    os << "driver " << drv << " (" << cuda.library << "), no usable GPU: "
       << (cuda.error.empty() ? "no CUDA device" : cuda.error) << "\n";
  } else {
    const int n = cuda.device_count;
    os << "driver " << drv << ", " << n << (n == 1 ? " GPU" : " GPUs") << "\n";
    for (int i = 0; i < n; ++i)
      os << "  GPU " << i << ": " << (i < (int)cuda.names.size() ? cuda.names[i] : "?") << "\n";
    if (n >= 2) {
      // Row labels right-aligned under the title; one right-aligned column per GPU.
      const std::string title = "  peer access (P2P/NVLink): ";
      const size_t w = std::max<size_t>(5, me::cat(" GPU", n - 1).size());
      auto cell = [&](const std::string& s) { return std::string(w > s.size() ? w - s.size() : 0, ' ') + s; };
      os << title;
      for (int j = 0; j < n; ++j) os << cell(me::cat("GPU", j));
      os << "\n";
      for (int i = 0; i < n; ++i) {
        const std::string label = me::cat("GPU", i);
        os << std::string(title.size() - label.size(), ' ') << label;
        for (int j = 0; j < n; ++j) {
          const bool yes = i < (int)cuda.peer.size() && j < (int)cuda.peer[i].size() && cuda.peer[i][j];
          os << cell(i == j ? "-" : (yes ? "yes" : "no"));
        }
        os << "\n";
      }
    }
  }

  // libfabric
  os << "libfabric:  ";
  if (!fabric.found) {
    os << "not found: " << fabric.error << " (" << kEfaHint << ")\n";
  } else {
    os << fabric.version << " (" << fabric.library << "), providers: ";
    if (fabric.providers.empty())
      os << "none" << (fabric.error.empty() ? "" : " (" + fabric.error + ")");
    else
      os << join(fabric.providers, ", ");
    os << "; efa: " << (fabric.has_efa ? "yes" : std::string("not found (") + kEfaHint + ")") << "\n";
  }
  return os.str();
}

}  // namespace me::doctor
