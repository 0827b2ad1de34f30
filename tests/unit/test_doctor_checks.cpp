// `megaengine doctor`'s checklists on made-up machines (a p5 node, broken variants of it, a CPU
// laptop) through a fake SystemView, the small parsers, the JSON, and the real directory probe.
#include <catch2/catch.hpp>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "engine/doctor/doctor_checks.h"

using namespace me::doctor;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A string literal with its embedded NULs, as bytes in a shared library.
template <size_t N>
std::string bytes(const char (&s)[N]) { return std::string(s, N - 1); }

// A machine as files, symbolic links, directories and environment variables.
struct FakeMachine {
  std::map<std::string, std::string> files, links, env;
  std::map<std::string, DirProbe> dirs;

  SystemView view() const {
    SystemView v;
    v.env = env;
    v.read_file = [this](const std::string& p) -> std::optional<std::string> {
      auto it = files.find(p);
      if (it == files.end()) return std::nullopt;
      return it->second;
    };
    v.is_file = [this](const std::string& p) { return files.count(p) > 0; };
    v.read_link = [this](const std::string& p) { return links.count(p) ? links.at(p) : std::string(); };
    v.list_dir = [this](const std::string& d) {
      std::set<std::string> names;
      for (const auto* m : {&files, &links})
        for (const auto& [path, _] : *m)
          if (path.rfind(d + "/", 0) == 0) names.insert(path.substr(d.size() + 1, path.find('/', d.size() + 1) - d.size() - 1));
      return std::vector<std::string>(names.begin(), names.end());
    };
    v.probe_dir = [this](const std::string& d) {
      auto it = dirs.find(d);
      if (it != dirs.end()) return it->second;
      DirProbe p;
      p.error = "No such file or directory";
      return p;
    };
    return v;
  }
};

DirProbe dir_with(uint64_t free_bytes) {
  DirProbe p;
  p.exists = p.is_dir = p.writable = true;
  p.free_bytes = free_bytes;
  return p;
}

const char* kPluginDir = "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu";

// One of the seeds' compute nodes, inside the container, healthy.
FakeMachine p5_node() {
  FakeMachine m;
  m.files["/proc/driver/nvidia/version"] =
      "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun  6 22:20:39 UTC 2023\nGCC version:  gcc 11\n";
  m.files["/opt/amazon/efa_installed_packages"] = "# EFA installer version: 1.26.1\n# Debug packages installed: no\n";
  m.links["/sys/class/infiniband/rdmap16s27/device/driver"] = "../../../../bus/pci/drivers/efa";
  m.links["/sys/class/infiniband/rdmap32s27/device/driver"] = "../../../../bus/pci/drivers/efa";
  m.files[std::string(kPluginDir) + "/libnccl-net.so"] = bytes("\x7f" "ELF\0\0Initializing aws-ofi-nccl 1.8.1-aws\0");
  m.files["/usr/local/cuda/version.json"] =
      "{\n   \"cuda\" : {\n      \"name\" : \"CUDA SDK\",\n      \"version\" : \"12.2.2\"\n   },\n   \"cuda_cudart\" : {}\n}\n";
  m.files["/sys/class/net/eth0/address"] = "02:00:00:00:00:01\n";
  m.files["/sys/class/net/lo/address"] = "00:00:00:00:00:00\n";
  m.env = {{"SLURM_JOB_ID", "42"},        {"SLURM_GPUS_ON_NODE", "8"},
           {"FI_PROVIDER", "efa"},        {"FI_EFA_USE_DEVICE_RDMA", "1"},
           {"NCCL_DEBUG", "INFO"},        {"NCCL_SOCKET_IFNAME", "^docker,lo"},
           {"LD_LIBRARY_PATH", std::string("/opt/amazon/efa/lib:") + kPluginDir}, {"HOME", "/root"}};
  m.dirs["/fsx"] = dir_with(1200ull << 30);
  m.dirs["/scratch"] = dir_with(28ull << 40);
  return m;
}

// The dlopen probes' answers on that node.
void p5_libraries(DoctorFacts& f) {
  f.cuda.found = true;
  f.cuda.driver_version_code = 12020;
  f.cuda.driver_version = "12.2";
  f.cuda.device_count = 8;
  f.cuda.names.assign(8, "NVIDIA H100 80GB HBM3");
  f.cuda.peer.assign(8, std::vector<bool>(8, true));
  for (int i = 0; i < 8; ++i) f.cuda.peer[i][i] = false;
  f.nvml.found = true;
  f.nvml.driver_version = "535.54.03";
  f.nvml.active_links.assign(8, 18);
  f.nccl.found = true;
  f.nccl.library = "/usr/lib/x86_64-linux-gnu/libnccl.so.2";
  f.nccl.version = "2.18.5";
  f.fabric.found = true;
  f.fabric.library = "/opt/amazon/efa/lib/libfabric.so.1";
  f.fabric.version = "1.18";
  f.fabric.providers = {"efa", "shm", "tcp"};
  f.fabric.has_efa = true;
}

DoctorFacts facts_of(const FakeMachine& m, bool gpu_build = true) {
  DoctorFacts f = gather_facts(m.view(), gpu_build);
  p5_libraries(f);
  return f;
}

const Check& find(const std::vector<Check>& checks, const std::string& name) {
  for (const auto& c : checks)
    if (c.name == name) return c;
  FAIL("no check named " << name);
  throw;
}

}  // namespace

TEST_CASE("doctor parsers: driver, EFA installer, aws-ofi-nccl, CUDA toolkit, versions, sizes", "[doctor]") {
  CHECK(driver_version_from_proc("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun  6 2023\n") == "535.54.03");
  CHECK(driver_version_from_proc("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\n") ==
        "580.95.05");
  CHECK(driver_version_from_proc("GCC version: gcc version 12.2.0\n").empty());
  CHECK(driver_version_from_proc("").empty());
  CHECK(efa_installer_version("# EFA installer version: 1.26.1\n") == "1.26.1");
  CHECK(efa_installer_version("nothing here").empty());
  CHECK(ofi_nccl_version_in(bytes("x\0aws-ofi-nccl plugin\0Initializing aws-ofi-nccl 1.13.2-aws\0")) == "1.13.2-aws");
  CHECK(ofi_nccl_version_in("no version").empty());
  CHECK(compare_versions("535.54.03", "535.54.03") == 0);
  CHECK(compare_versions("535.54.02", "535.54.03") < 0);
  CHECK(compare_versions("580.95.05", "535.54.03") > 0);
  CHECK(compare_versions("1.26", "1.26.1") < 0);
  CHECK(compare_versions("1.9.0", "1.26.1") < 0);  // numeric, not lexical
  CHECK(compare_versions("1.8.1-aws", "1.8.1") == 0);
  CHECK(human_bytes(0) == "0 B");
  CHECK(human_bytes(1536) == "1.5 KiB");
  CHECK(human_bytes(28ull << 40) == "28.0 TiB");

  FakeMachine m;
  m.files["/opt/cuda-11.0/version.txt"] = "CUDA Version 11.0.228\n";
  m.env["CUDA_HOME"] = "/opt/cuda-11.0";
  const CudaToolkit old = find_cuda_toolkit(m.view());
  CHECK(old.version == "11.0.228");
  CHECK(old.path == "/opt/cuda-11.0/version.txt");
  CHECK(find_cuda_toolkit(FakeMachine{}.view()).version.empty());
  FakeMachine headers_only;  // no version.json (as on the GPU machine): cuda.h's CUDA_VERSION
  headers_only.files["/usr/local/cuda/include/cuda.h"] = "#ifndef __cuda_cuda_h__\n#define CUDA_VERSION 13000\n";
  const CudaToolkit from_header = find_cuda_toolkit(headers_only.view());
  CHECK(from_header.version == "13.0");
  CHECK(from_header.path == "/usr/local/cuda/include/cuda.h");
}

TEST_CASE("doctor on a healthy p5 node: every check passes", "[doctor]") {
  const FakeMachine m = p5_node();
  const DoctorFacts f = facts_of(m);
  CHECK(f.under_slurm);
  CHECK(f.expected_gpus == 8);
  CHECK(f.efa_devices == std::vector<std::string>{"rdmap16s27", "rdmap32s27"});
  CHECK(f.plugin.on_loader_path);
  CHECK(f.plugin.version == "1.8.1-aws");
  CHECK(f.toolkit.version == "12.2.2");
  CHECK(f.net_interfaces == std::vector<std::string>{"eth0", "lo"});
  CHECK(f.fi_nccl_env.size() == 4);  // FI_* and NCCL_* only, sorted

  const auto checks = run_checks(f);
  const std::string text = format_checks(checks);
  INFO(text);
  CHECK(checks.size() == 12);
  for (const auto& c : checks) CHECK(status_name(c.status) == std::string("pass"));
  CHECK(doctor_exit_status(checks) == 0);
  CHECK(contains(text, "host checklist\n  PASS  driver         NVIDIA driver 535.54.03 (/proc/driver/nvidia/version) >= 535.54.03; it supports CUDA 12.2\n"));
  CHECK(contains(text, "  PASS  gpus           8 x NVIDIA H100 80GB HBM3, as expected (8)\n"));
  CHECK(contains(text, "  PASS  nvlink         all 56 GPU pairs have peer access; 18 active NVLinks per GPU\n"));
  CHECK(contains(text, "  PASS  efa            2 EFA devices (rdmap16s27, ...); EFA installer 1.26.1 >= 1.26.1\n"));
  CHECK(contains(text, "  PASS  /fsx           writable, 1.2 TiB free\n"));
  CHECK(contains(text, "container checklist\n  PASS  cuda-toolkit   CUDA toolkit 12.2.2 (/usr/local/cuda/version.json); the driver supports CUDA 12.2\n"));
  CHECK(contains(text, "  PASS  aws-ofi-nccl   aws-ofi-nccl 1.8.1-aws (/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net.so)\n"));
  CHECK(contains(text, "  PASS  libfabric      libfabric 1.18 (/opt/amazon/efa/lib/libfabric.so.1), providers: efa, shm, tcp\n"));
  CHECK(contains(text, "  PASS  fi-env         FI_EFA_USE_DEVICE_RDMA=1 FI_PROVIDER=efa\n"));
  CHECK(contains(text, "  PASS  nccl-env       NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=^docker,lo\n"));
  CHECK(contains(text, "doctor: 12 passed, 0 failed, 0 skipped; exit status 0\n"));
}

TEST_CASE("doctor on broken p5 nodes: each fault is one failing line that says what to do", "[doctor]") {
  FakeMachine m = p5_node();
  auto one_failure = [](const DoctorFacts& f, const std::string& name, const std::string& part) {
    const auto checks = run_checks(f);
    INFO(format_checks(checks));
    CHECK(status_name(find(checks, name).status) == std::string("fail"));
    CHECK(contains(find(checks, name).detail, part));
    CHECK(std::count_if(checks.begin(), checks.end(), [](const Check& c) { return c.status == CheckStatus::fail; }) == 1);
    CHECK(doctor_exit_status(checks) == 1);
  };
  SECTION("old driver") {
    m.files["/proc/driver/nvidia/version"] = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  525.85.12  Sat Jan 28\n";
    one_failure(facts_of(m), "driver", "525.85.12 (/proc/driver/nvidia/version) is older than 535.54.03");
  }
  SECTION("no /proc entry: NVML's version is used") {
    m.files.erase("/proc/driver/nvidia/version");
    const auto checks = run_checks(facts_of(m));
    CHECK(find(checks, "driver").detail == "NVIDIA driver 535.54.03 (NVML) >= 535.54.03; it supports CUDA 12.2");
  }
  SECTION("a GPU missing from the allocation") {
    DoctorFacts f = facts_of(m);
    f.cuda.device_count = 7;
    f.cuda.names.resize(7);
    one_failure(f, "gpus", "7 GPUs visible, expected 8");
  }
  SECTION("no peer access between two GPUs") {
    DoctorFacts f = facts_of(m);
    f.cuda.peer[2][5] = false;
    one_failure(f, "nvlink", "no peer access for GPU2->GPU5");
  }
  SECTION("peer access over PCIe only") {
    DoctorFacts f = facts_of(m);
    f.nvml.active_links.assign(8, 0);
    one_failure(f, "nvlink", "over PCIe: NVML sees no active NVLink");
  }
  SECTION("old EFA installer") {
    m.files["/opt/amazon/efa_installed_packages"] = "# EFA installer version: 1.25.0\n";
    one_failure(facts_of(m), "efa", "EFA installer 1.25.0 is older than 1.26.1");
  }
  SECTION("/fsx not mounted in a Slurm job") {
    m.dirs.erase("/fsx");
    one_failure(facts_of(m), "/fsx", "does not exist (No such file or directory): mount it on every node");
  }
  SECTION("/scratch read-only, /fsx nearly full") {
    m.dirs["/scratch"].writable = false;
    m.dirs["/scratch"].error = "cannot create a file there: Read-only file system";
    const auto checks = run_checks(facts_of(m));
    CHECK(find(checks, "/scratch").detail == "not writable: cannot create a file there: Read-only file system");
    m.dirs["/scratch"] = dir_with(1ull << 40);
    m.dirs["/fsx"] = dir_with(3ull << 30);
    one_failure(facts_of(m), "/fsx", "only 3.0 GiB free, less than 10.0 GiB (ME_DOCTOR_MIN_FREE_GB)");
  }
  SECTION("toolkit newer than the driver") {
    m.files["/usr/local/cuda/version.json"] = R"({"cuda": {"name": "CUDA SDK", "version": "13.0.1"}})";
    one_failure(facts_of(m), "cuda-toolkit", "CUDA toolkit 13.0.1 (/usr/local/cuda/version.json) is newer than the driver supports (CUDA 12.2)");
  }
  SECTION("the plugin installed but not on LD_LIBRARY_PATH") {
    m.env["LD_LIBRARY_PATH"] = "/opt/amazon/efa/lib";
    one_failure(facts_of(m), "aws-ofi-nccl",
                "is at /opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net.so but not on the loader's path, so NCCL will not "
                "load it: export LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH");
  }
  SECTION("no plugin at all") {
    m.files.erase(std::string(kPluginDir) + "/libnccl-net.so");
    one_failure(facts_of(m), "aws-ofi-nccl", "not found (libnccl-net-ofi.so / libnccl-net.so in LD_LIBRARY_PATH)");
  }
  SECTION("NCCL_NET_PLUGIN=none") {
    m.env["NCCL_NET_PLUGIN"] = "none";
    const auto checks = run_checks(facts_of(m));
    CHECK(find(checks, "aws-ofi-nccl").status == CheckStatus::fail);
    CHECK(contains(find(checks, "aws-ofi-nccl").detail, "NCCL_NET_PLUGIN=none: NCCL loads no network plugin, so it cannot use EFA"));
  }
  SECTION("Debian's libfabric first on the path: no efa provider") {
    DoctorFacts f = facts_of(m);
    f.fabric.library = "/usr/lib/x86_64-linux-gnu/libfabric.so.1";
    f.fabric.providers = {"shm", "tcp", "udp"};
    f.fabric.has_efa = false;
    one_failure(f, "libfabric", "no efa provider although the node has EFA devices; put /opt/amazon/efa/lib first");
  }
  SECTION("FI_PROVIDER=tcp") {
    m.env["FI_PROVIDER"] = "tcp";
    one_failure(facts_of(m), "fi-env", "FI_PROVIDER=tcp keeps libfabric off EFA");
  }
  SECTION("FI_PROVIDER=^efa excludes it") {
    m.env["FI_PROVIDER"] = "^efa";
    one_failure(facts_of(m), "fi-env", "FI_PROVIDER=^efa keeps libfabric off EFA");
  }
  SECTION("GPUDirect RDMA off") {
    m.env["FI_EFA_USE_DEVICE_RDMA"] = "0";
    one_failure(facts_of(m), "fi-env", "FI_EFA_USE_DEVICE_RDMA=0 turns GPUDirect RDMA off");
  }
  SECTION("NCCL_P2P_DISABLE=1") {
    m.env["NCCL_P2P_DISABLE"] = "1";
    one_failure(facts_of(m), "nccl-env", "NCCL_P2P_DISABLE=1 keeps NCCL off NVLink");
  }
  SECTION("NCCL_SOCKET_IFNAME naming an interface this node lacks") {
    m.env["NCCL_SOCKET_IFNAME"] = "ens";
    one_failure(facts_of(m), "nccl-env", "NCCL_SOCKET_IFNAME=ens matches none of this machine's interfaces (eth0, lo)");
    m.env["NCCL_SOCKET_IFNAME"] = "=eth";  // exact names: eth0 is not eth
    one_failure(facts_of(m), "nccl-env", "NCCL_SOCKET_IFNAME==eth matches none");
    m.env["NCCL_SOCKET_IFNAME"] = "=eth0,ens5";
    CHECK(doctor_exit_status(run_checks(facts_of(m))) == 0);
  }
}

TEST_CASE("doctor on a CPU build without GPU, EFA or cluster storage: skips with reasons, exit 0", "[doctor]") {
  FakeMachine laptop;
  laptop.env = {{"PATH", "/usr/bin"}};
  DoctorFacts f = gather_facts(laptop.view(), /*gpu_build=*/false);
  f.cuda.error = "libcuda.so.1: cannot open shared object file";
  f.nvml.error = "libnvidia-ml.so.1: cannot open shared object file";
  f.nccl.error = "libnccl.so.2: cannot open shared object file";
  f.fabric.error = "libfabric.so.1: cannot open shared object file";
  auto checks = run_checks(f);
  const std::string text = format_checks(checks);
  INFO(text);
  CHECK(doctor_exit_status(checks) == 0);
  CHECK(contains(text, "  SKIP  driver         no NVIDIA driver: /proc/driver/nvidia/version is missing and NVML says: "
                       "libnvidia-ml.so.1: cannot open shared object file; this megaengine is a CPU build"));
  CHECK(contains(text, "  SKIP  nvlink         peer access not checked; this megaengine is a CPU build"));
  CHECK(contains(text, "  SKIP  efa            no EFA device in /sys/class/infiniband"));
  CHECK(contains(text, "  SKIP  /fsx           does not exist here (not a cluster node;"));
  CHECK(contains(text, "  SKIP  aws-ofi-nccl   not found; no EFA device here"));
  CHECK(contains(text, "  PASS  fi-env         none set\n"));
  CHECK(contains(text, "doctor: 2 passed, 0 failed, 10 skipped; exit status 0\n"));

  SECTION("the same machine as a GPU build: the missing GPU pieces fail") {
    f = gather_facts(laptop.view(), /*gpu_build=*/true);
    checks = run_checks(f);
    for (const char* name : {"driver", "gpus", "cuda-toolkit", "nccl"}) CHECK(find(checks, name).status == CheckStatus::fail);
    CHECK(find(checks, "nvlink").status == CheckStatus::skip);  // 0 GPUs: nothing to pair
    CHECK(doctor_exit_status(checks) == 1);
  }
  SECTION("a GPU build told ME_DOCTOR_GPUS=0 (an image built on a head node without GPUs)") {
    laptop.env["ME_DOCTOR_GPUS"] = "0";
    DoctorFacts g = gather_facts(laptop.view(), /*gpu_build=*/true);
    CHECK_FALSE(g.gpu_expected);
    checks = run_checks(g);
    CHECK(doctor_exit_status(checks) == 0);
    CHECK(find(checks, "gpus").detail == "0 GPUs visible; ME_DOCTOR_GPUS=0 says this machine has no GPU, so GPU checks do not apply");
  }
  SECTION("FI_PROVIDER=efa where there is no EFA device") {
    laptop.env["FI_PROVIDER"] = "efa";
    DoctorFacts g = gather_facts(laptop.view(), false);
    CHECK(find(run_checks(g), "fi-env").status == CheckStatus::fail);
    CHECK(contains(find(run_checks(g), "fi-env").detail, "but this machine has no EFA device"));
  }
  SECTION("a directory named in ME_DOCTOR_PATHS must exist") {
    laptop.env["ME_DOCTOR_PATHS"] = "/data:/ckpt";
    laptop.dirs["/data"] = dir_with(50ull << 30);
    DoctorFacts g = gather_facts(laptop.view(), false);
    REQUIRE(g.dirs.size() == 2);
    checks = run_checks(g);
    CHECK(find(checks, "/data").status == CheckStatus::pass);
    CHECK(find(checks, "/ckpt").status == CheckStatus::fail);
  }
}

TEST_CASE("doctor --json: one object, every check, strings escaped", "[doctor]") {
  const std::vector<Check> checks = {
      {"host", "driver", CheckStatus::pass, "580.95.05", "NVIDIA driver 580.95.05"},
      {"container", "nccl-env", CheckStatus::fail, "1", "NCCL_SOCKET_IFNAME=\"x\\y\"\tnext\nline \x01"}};
  const std::string json = checks_json(checks, {{"megaengine", "0.1.0"}});
  CHECK(json ==
        "{\n  \"header\": {\"megaengine\": \"0.1.0\"},\n  \"status\": \"fail\", \"passed\": 1, \"failed\": 1, \"skipped\": 0,\n"
        "  \"checks\": [\n"
        "    {\"group\": \"host\", \"name\": \"driver\", \"status\": \"pass\", \"value\": \"580.95.05\", \"detail\": \"NVIDIA driver 580.95.05\"},\n"
        "    {\"group\": \"container\", \"name\": \"nccl-env\", \"status\": \"fail\", \"value\": \"1\", "
        "\"detail\": \"NCCL_SOCKET_IFNAME=\\\"x\\\\y\\\"\\tnext\\nline \\u0001\"}\n  ]\n}\n");
}

TEST_CASE("the real directory probe: writable temp dir, a missing path, a file", "[doctor]") {
  char tmpl[] = "/tmp/me-doctor-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const SystemView sys = real_system();
  const DirProbe ok = sys.probe_dir(dir);
  CHECK(ok.exists);
  CHECK(ok.is_dir);
  CHECK(ok.writable);
  CHECK(ok.free_bytes > 0);
  CHECK(sys.list_dir(dir).empty());  // the probe's file is gone
  const DirProbe missing = sys.probe_dir(dir + "/none");
  CHECK_FALSE(missing.exists);
  CHECK(missing.error == "No such file or directory");
  std::ofstream(dir + "/file") << "x";
  CHECK(sys.is_file(dir + "/file"));
  CHECK_FALSE(sys.is_file(dir));
  CHECK(sys.read_file(dir + "/file").value_or("") == "x");
  CHECK_FALSE(sys.probe_dir(dir + "/file").is_dir);
  if (geteuid() != 0) {  // root writes anywhere
    chmod(tmpl, 0500);
    CHECK_FALSE(sys.probe_dir(dir).writable);
    chmod(tmpl, 0700);
  }
  unlink((dir + "/file").c_str());
  rmdir(tmpl);
  CHECK(sys.getenv("PATH") != nullptr);
  CHECK(sys.getenv("ME_NO_SUCH_VARIABLE_SET") == nullptr);
}

TEST_CASE("doctor on this machine: gathers without throwing, one line per check", "[doctor]") {
  DoctorFacts f = gather_facts(real_system(), false);
  f.cuda = probe_cuda();
  f.nvml = probe_nvml();
  f.nccl = probe_nccl();
  f.fabric = probe_libfabric();
  const auto checks = run_checks(f);
  const std::string text = format_checks(checks);
  INFO(text);
  CHECK(checks.size() == 10 + f.dirs.size());
  CHECK(std::count(text.begin(), text.end(), '\n') == static_cast<long>(checks.size()) + 3);  // 2 titles + summary
}
