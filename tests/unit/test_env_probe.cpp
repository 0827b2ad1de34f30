// Environment probes behind `megaengine doctor`: missing libraries are report lines, never
// link errors or crashes; what is installed (Debian's libfabric1, NCCL from the CUDA tree)
// is read through dlopen; the report's layout on hand-made GPU reports.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <regex>
#include <string>
#include <vector>

#include "engine/doctor/env_probe.h"

using namespace me::doctor;

namespace {

bool file_exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

bool loadable(const std::string& lib) {
  void* h = dlopen(lib.c_str(), RTLD_LAZY | RTLD_LOCAL);
  return h != nullptr;  // left open: the probe reopens it (refcounted)
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const char* kMissing = "libmegaengine-no-such-library.so.7";

}  // namespace

TEST_CASE("missing libraries give found=false with a reason, and a 'not found' report", "[env_probe]") {
  const FabricReport f = probe_libfabric(kMissing);
  CHECK_FALSE(f.found);
  CHECK_FALSE(f.error.empty());
  CHECK(contains(f.error, kMissing));  // dlerror names the file
  CHECK(f.providers.empty());
  CHECK_FALSE(f.has_efa);

  const NcclReport n = probe_nccl(kMissing);
  CHECK_FALSE(n.found);
  CHECK_FALSE(n.error.empty());

  const CudaReport c = probe_cuda(kMissing);
  CHECK_FALSE(c.found);
  CHECK_FALSE(c.error.empty());
  CHECK(c.device_count == 0);
  CHECK(c.names.empty());

  const std::string rep = format_report(f, n, c);
  CHECK(contains(rep, "NCCL:       not found: "));
  CHECK(contains(rep, "CUDA:       not found: "));
  CHECK(contains(rep, "libfabric:  not found: "));
  CHECK(contains(rep, "/opt/amazon/efa/lib"));  // the hint for EFA nodes
}

TEST_CASE("a library without the expected symbols is not found, with the symbol named", "[env_probe]") {
  // libm is always there and has none of these entry points.
  const FabricReport f = probe_libfabric("libm.so.6");
  CHECK_FALSE(f.found);
  CHECK(contains(f.error, "fi_version"));
  const NcclReport n = probe_nccl("libm.so.6");
  CHECK_FALSE(n.found);
  CHECK(contains(n.error, "ncclGetVersion"));
  const CudaReport c = probe_cuda("libm.so.6");
  CHECK_FALSE(c.found);
  CHECK(contains(c.error, "cuInit"));
}

TEST_CASE("Debian's libfabric1: version 1.x, tcp or sockets among the providers, no EFA", "[env_probe]") {
  if (!loadable("libfabric.so.1")) {
    WARN("libfabric.so.1 not installed (apt-get install -y libfabric1): skipped");
    return;
  }
  const FabricReport f = probe_libfabric();
  INFO(format_report(f, NcclReport{}, CudaReport{}));
  REQUIRE(f.found);
  CHECK(f.error.empty());
  CHECK(f.version.rfind("1.", 0) == 0);
  CHECK(contains(f.library, "libfabric.so.1"));
  CHECK(f.library.front() == '/');  // the path actually loaded, from dlinfo
  const auto& p = f.providers;
  CHECK(std::is_sorted(p.begin(), p.end()));
  CHECK(std::adjacent_find(p.begin(), p.end()) == p.end());
  CHECK((std::count(p.begin(), p.end(), "tcp") + std::count(p.begin(), p.end(), "sockets")) > 0);
  if (!contains(f.library, "amazon")) {
    CHECK_FALSE(f.has_efa);
    const std::string rep = format_report(f, NcclReport{}, CudaReport{});
    CHECK(contains(rep, "libfabric:  " + f.version + " (" + f.library + "), providers: "));
    CHECK(contains(rep, "efa: not found (AWS EFA nodes"));
  }
}

TEST_CASE("NCCL from the CUDA tree reports its version", "[env_probe]") {
  const std::string path = "/usr/local/cuda/lib64/libnccl.so.2";
  if (!file_exists(path)) {
    WARN(path << " not present: skipped");
    return;
  }
  const NcclReport n = probe_nccl(path);
  INFO(n.error);
  REQUIRE(n.found);
  CHECK(n.error.empty());
  CHECK(std::regex_match(n.version, std::regex(R"(2\.\d+\.\d+)")));
  CHECK(n.version_code >= 20000);
  CHECK(n.version == nccl_version_string(n.version_code));
  const std::string rep = format_report(FabricReport{}, n, CudaReport{});
  CHECK(contains(rep, "NCCL:       " + n.version + " ("));
}

TEST_CASE("NCCL and CUDA version codes decode", "[env_probe]") {
  CHECK(nccl_version_string(22803) == "2.28.3");
  CHECK(nccl_version_string(21805) == "2.18.5");
  CHECK(nccl_version_string(20900) == "2.9.0");
  CHECK(nccl_version_string(2804) == "2.8.4");  // old encoding, major*1000
  CHECK(nccl_version_string(2708) == "2.7.8");
  CHECK(nccl_version_string(0) == "unknown");
  CHECK(cuda_version_string(13000) == "13.0");
  CHECK(cuda_version_string(12040) == "12.4");
  CHECK(cuda_version_string(12090) == "12.9");
  CHECK(cuda_version_string(11080) == "11.8");
}

TEST_CASE("CUDA on this machine: GPUs listed, or an error, never a crash", "[env_probe]") {
  const CudaReport c = probe_cuda();
  INFO(format_report(FabricReport{}, NcclReport{}, c));
  if (!c.found || c.device_count == 0) {
    CHECK_FALSE(c.error.empty());
    CHECK(c.names.empty());
    CHECK(c.peer.empty());
  } else {
    CHECK(c.error.empty());
    CHECK((int)c.names.size() == c.device_count);
    REQUIRE((int)c.peer.size() == c.device_count);
    for (int i = 0; i < c.device_count; ++i) {
      REQUIRE((int)c.peer[i].size() == c.device_count);
      CHECK_FALSE(c.peer[i][i]);
    }
    CHECK(c.driver_version_code > 0);
  }
  const std::string rep = format_report(FabricReport{}, NcclReport{}, c);
  CHECK(contains(rep, "CUDA:       "));
}

TEST_CASE("CUDA stub library: loads, cuInit fails, reported as no usable GPU", "[env_probe]") {
  const std::string stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (!file_exists(stub)) {
    WARN(stub << " not present: skipped");
    return;
  }
  const CudaReport c = probe_cuda(stub);
  INFO(c.error);
  if (!c.found) {  // a stub without some entry point: still a clean error
    CHECK_FALSE(c.error.empty());
    return;
  }
  CHECK(c.device_count == 0);
  CHECK(contains(c.error, "cuInit(0) failed"));
  const std::string rep = format_report(FabricReport{}, NcclReport{}, c);
  CHECK(contains(rep, "no usable GPU: cuInit(0) failed"));
}

TEST_CASE("format_report: two GPUs with peer access, NCCL, libfabric without EFA", "[env_probe]") {
  FabricReport f;
  f.found = true;
  f.library = "libfabric.so.1";
  f.version = "1.17";
  f.providers = {"psm2", "shm", "sockets", "tcp", "udp"};
  NcclReport n;
  n.found = true;
  n.library = "libnccl.so.2";
  n.version = "2.28.3";
  n.version_code = 22803;
  CudaReport c;
  c.found = true;
  c.library = "libcuda.so.1";
  c.driver_version_code = 13000;
  c.driver_version = "13.0";
  c.device_count = 2;
  c.names = {"NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"};
  c.peer = {{false, true}, {true, false}};

  const std::string expected =
      "NCCL:       2.28.3 (libnccl.so.2)\n"
      "CUDA:       driver 13.0, 2 GPUs\n"
      "  GPU 0: NVIDIA H100 80GB HBM3\n"
      "  GPU 1: NVIDIA H100 80GB HBM3\n"
      "  peer access (P2P/NVLink):  GPU0 GPU1\n"
      "                        GPU0    -  yes\n"
      "                        GPU1  yes    -\n"
      "libfabric:  1.17 (libfabric.so.1), providers: psm2, shm, sockets, tcp, udp; efa: not found "
      "(AWS EFA nodes ship their own libfabric under /opt/amazon/efa/lib: put it first in "
      "LD_LIBRARY_PATH)\n";
  CHECK(format_report(f, n, c) == expected);

  SECTION("one-way access and EFA present") {
    c.peer = {{false, false}, {true, false}};
    f.providers = {"efa", "shm", "tcp"};
    f.has_efa = true;
    const std::string rep = format_report(f, n, c);
    CHECK(contains(rep, "                        GPU0    -   no\n"));
    CHECK(contains(rep, "                        GPU1  yes    -\n"));
    CHECK(contains(rep, "providers: efa, shm, tcp; efa: yes\n"));
  }
  SECTION("one GPU: no matrix") {
    c.device_count = 1;
    c.names.resize(1);
    c.peer = {{false}};
    const std::string rep = format_report(f, n, c);
    CHECK(contains(rep, "CUDA:       driver 13.0, 1 GPU\n  GPU 0: NVIDIA H100 80GB HBM3\nlibfabric:"));
    CHECK_FALSE(contains(rep, "peer access"));
  }
  SECTION("libfabric loaded but fi_getinfo found nothing") {
    f.providers.clear();
    f.error = "fi_getinfo failed: No data available (-61)";
    CHECK(contains(format_report(f, n, c), "providers: none (fi_getinfo failed: No data available (-61)); efa: not found"));
  }
}

TEST_CASE("NVML: missing library or symbols are reported, never a crash", "[env_probe]") {
  const NvmlReport missing = probe_nvml(kMissing);
  CHECK_FALSE(missing.found);
  CHECK(contains(missing.error, kMissing));
  CHECK(missing.active_links.empty());
  const NvmlReport wrong = probe_nvml("libm.so.6");
  CHECK_FALSE(wrong.found);
  CHECK(contains(wrong.error, "nvmlInit_v2"));
  // This machine's own NVML, if any: a version string when it initialises.
  const NvmlReport here = probe_nvml();
  if (here.found) CHECK_FALSE(here.driver_version.empty());
  else CHECK_FALSE(here.error.empty());
}
