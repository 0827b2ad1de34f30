// What `megaengine doctor` reads from the machine besides the libraries it dlopens: environment
// variables, files under /proc, /sys and /opt, and whether a directory takes a new file. It all
// goes through SystemView, so the checks also run on a made-up machine (tests/unit).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace me::doctor {

struct DirProbe {
  bool exists = false;
  bool is_dir = false;
  bool writable = false;    // a file could be created, written and removed there
  uint64_t free_bytes = 0;  // statvfs f_bavail: what an unprivileged writer gets
  std::string error;        // why it is not writable / not a directory
};

struct SystemView {
  std::map<std::string, std::string> env;
  // Whole file, or nullopt when missing or unreadable.
  std::function<std::optional<std::string>(const std::string& path)> read_file;
  std::function<bool(const std::string& path)> is_file;  // a regular file (or a link to one)
  // Entry names of a directory (no "." or ".."), sorted; empty when it does not exist.
  std::function<std::vector<std::string>(const std::string& dir)> list_dir;
  // Target of a symbolic link, "" when it is not one.
  std::function<std::string(const std::string& path)> read_link;
  std::function<DirProbe(const std::string& dir)> probe_dir;

  const char* getenv(const std::string& name) const;  // nullptr when unset
};

// The live machine: environ, the real files, mkstemp + statvfs.
SystemView real_system();

// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun ..." -> "535.54.03"; "" if none.
std::string driver_version_from_proc(const std::string& proc_text);

// RDMA devices under /sys/class/infiniband whose kernel driver is efa ("rdmap16s27", ...).
std::vector<std::string> efa_devices(const SystemView& sys);

// "# EFA installer version: 1.26.1" in /opt/amazon/efa_installed_packages -> "1.26.1"; "" if none.
std::string efa_installer_version(const std::string& installed_packages_text);

// The aws-ofi-nccl plugin NCCL would load: libnccl-net-<NCCL_NET_PLUGIN>.so, libnccl-net-ofi.so or
// libnccl-net.so, looked up in LD_LIBRARY_PATH and the system library directories (as dlopen does,
// ld.so.cache aside), then in the usual install prefixes (found there: NCCL will not see it).
struct NetPlugin {
  std::string path;              // "" when not found anywhere
  bool on_loader_path = false;   // found where NCCL's dlopen looks
  std::string version;           // "1.8.1-aws", from the library's "aws-ofi-nccl X" string
  std::string disabled_by;       // "NCCL_NET_PLUGIN=none" when the user turned plugins off
};
NetPlugin find_ofi_nccl_plugin(const SystemView& sys);
// The version aws-ofi-nccl compiles into its log line ("Initializing aws-ofi-nccl 1.8.1-aws").
std::string ofi_nccl_version_in(const std::string& library_bytes);

// The CUDA toolkit of this image: $CUDA_HOME (else /usr/local/cuda)/version.json, version.txt
// (toolkits before 11.1), else CUDA_VERSION in include/cuda.h.
struct CudaToolkit {
  std::string version;  // "13.0.1"; "" when not found
  std::string path;     // the file it was read from, or where it was looked for
};
CudaToolkit find_cuda_toolkit(const SystemView& sys);

// Numeric comparison of dotted versions ("535.54.03" < "580.95.05", "1.26.1" > "1.9"):
// negative, zero or positive. Non-digit suffixes ("-aws") are ignored.
int compare_versions(const std::string& a, const std::string& b);

// 1536 -> "1.5 KiB", 3.2e12 -> "2.9 TiB".
std::string human_bytes(uint64_t bytes);

}  // namespace me::doctor
