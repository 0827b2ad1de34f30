// Environment probes behind `megaengine doctor`: is libfabric there (and with which
// providers, EFA in particular), which NCCL, which CUDA driver, how many GPUs and which of
// them can reach each other peer to peer (P2P/NVLink).
//
// Every library is opened with dlopen at run time and its few entry points are looked up
// with dlsym; nothing here links against libfabric, NCCL or CUDA. A missing library, a
// missing symbol or a failing call is never an exception or a crash: it is `found = false`
// (or an empty device list) with the reason in `error`, and a line in format_report().
#pragma once
#include <string>
#include <vector>

namespace me::doctor {

struct FabricReport {
  bool found = false;
  std::string library;                 // path actually loaded (dlinfo), else the name asked for
  std::string version;                 // "1.17", from fi_version()
  std::vector<std::string> providers;  // unique provider names from fi_getinfo, sorted
  bool has_efa = false;                // the "efa" provider is among them
  std::string error;                   // why not found / why fi_getinfo failed; empty if fine
};

struct NcclReport {
  bool found = false;
  std::string library;  // path actually loaded, else the name asked for
  std::string version;  // "2.28.3", from ncclGetVersion()
  int version_code = 0; // raw ncclGetVersion() value (22803)
  std::string error;
};

struct CudaReport {
  bool found = false;         // libcuda could be loaded and its entry points resolved
  std::string library;        // path actually loaded, else the name asked for
  int driver_version_code = 0;  // cuDriverGetVersion(): 13000
  std::string driver_version;   // "13.0"
  int device_count = 0;
  std::vector<std::string> names;        // cuDeviceGetName per device
  std::vector<std::vector<bool>> peer;   // peer[i][j]: device i can access device j (i != j)
  std::string error;  // library missing, or cuInit/cuDeviceGetCount failed (e.g. no GPU)
};

// NVML (libnvidia-ml, installed with the driver): the driver's own version string ("580.95.05",
// which cuDriverGetVersion does not give) and the active NVLinks of every GPU on the node. NVML
// counts all of the node's GPUs, whatever CUDA_VISIBLE_DEVICES says.
struct NvmlReport {
  bool found = false;           // loaded, entry points resolved and nvmlInit succeeded
  std::string library;
  std::string driver_version;   // "580.95.05"
  std::vector<int> active_links;  // per GPU: NVLinks in the active state (0: PCIe only)
  std::string error;
};

// Each probe opens `library` by name (searched like any dlopen: LD_LIBRARY_PATH, ld.so.cache)
// or by path. None of them throws.
FabricReport probe_libfabric(const std::string& library = "libfabric.so.1");
NcclReport probe_nccl(const std::string& library = "libnccl.so.2");
CudaReport probe_cuda(const std::string& library = "libcuda.so.1");
NvmlReport probe_nvml(const std::string& library = "libnvidia-ml.so.1");

// Decoders, exposed for tests.
// NCCL >= 2.9 encodes major*10000 + minor*100 + patch, older ones major*1000 + minor*100 + patch.
std::string nccl_version_string(int code);
// CUDA: 13000 -> "13.0", 12040 -> "12.4".
std::string cuda_version_string(int code);

// Human-readable lines, one block per probe, e.g.
//   NCCL:       2.28.3 (libnccl.so.2)
//   CUDA:       driver 13.0, 2 GPUs
//     GPU 0: NVIDIA H100 80GB HBM3
//     GPU 1: NVIDIA H100 80GB HBM3
//     peer access (P2P/NVLink):  GPU0 GPU1
//                           GPU0    -  yes
//                           GPU1  yes    -
//   libfabric:  1.17 (libfabric.so.1), providers: shm, sockets, tcp, udp; efa: not found (...)
// and "not found: <reason>" lines for what is missing.
std::string format_report(const FabricReport& fabric, const NcclReport& nccl, const CudaReport& cuda);

}  // namespace me::doctor
