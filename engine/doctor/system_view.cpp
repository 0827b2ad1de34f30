#include "engine/doctor/system_view.h"
#include "engine/core/strings.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include "engine/core/error.h"

extern char** environ;

namespace me::doctor {
namespace {

std::optional<std::string> read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return os.str();
}

std::vector<std::string> list_directory(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (!d) return names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_symlink(const std::string& path) {
  char buf[4096];
  const ssize_t n = readlink(path.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Writable means a new file can be made there: access(W_OK) says yes to root on a directory
// a Lustre client or a read-only bind mount will still refuse.
DirProbe probe_directory(const std::string& dir) {
  DirProbe p;
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    p.error = std::strerror(errno);
    return p;
  }
  p.exists = true;
  p.is_dir = S_ISDIR(st.st_mode);
  if (!p.is_dir) {
    p.error = "not a directory";
    return p;
  }
  struct statvfs vfs;
  if (statvfs(dir.c_str(), &vfs) == 0) p.free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  std::string name = dir + "/.megaengine-doctor-XXXXXX";
  const int fd = mkstemp(name.data());
  if (fd < 0) {
    p.error = cat("cannot create a file there: ", std::strerror(errno));
    return p;
  }
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int write_errno = errno;
  ::close(fd);
  ::unlink(name.c_str());
  p.writable = wrote;
  if (!wrote) p.error = cat("cannot write a file there: ", std::strerror(write_errno));
  return p;
}

bool regular_file(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

const char* SystemView::getenv(const std::string& name) const {
  auto it = env.find(name);
  return it == env.end() ? nullptr : it->second.c_str();
}

SystemView real_system() {
  SystemView s;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) s.env.emplace(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
  }
  s.read_file = read_whole_file;
  s.is_file = regular_file;
  s.list_dir = list_directory;
  s.read_link = read_symlink;
  s.probe_dir = probe_directory;
  return s;
}

std::string driver_version_from_proc(const std::string& proc_text) {
  const std::string first_line = proc_text.substr(0, proc_text.find('\n'));
  if (first_line.rfind("NVRM version:", 0) != 0) return "";
  std::smatch m;
  static const std::regex dotted(R"((?:^|\s)([0-9]+\.[0-9]+(?:\.[0-9]+)?)(?:\s|$))");
  return std::regex_search(first_line, m, dotted) ? m[1].str() : std::string();
}

std::vector<std::string> efa_devices(const SystemView& sys) {
  std::vector<std::string> out;
  for (const auto& dev : sys.list_dir("/sys/class/infiniband")) {
    const std::string driver = sys.read_link("/sys/class/infiniband/" + dev + "/device/driver");
    const auto slash = driver.find_last_of('/');
    if (driver.substr(slash == std::string::npos ? 0 : slash + 1) == "efa") out.push_back(dev);
  }
  return out;
}

std::string efa_installer_version(const std::string& text) {
  std::smatch m;
  static const std::regex line(R"(EFA installer version:\s*v?([0-9][0-9.]*))");
  return std::regex_search(text, m, line) ? m[1].str() : std::string();
}

std::string ofi_nccl_version_in(const std::string& bytes) {
  static const std::string tag = "aws-ofi-nccl ";
  for (size_t at = bytes.find(tag); at != std::string::npos; at = bytes.find(tag, at + 1)) {
    size_t end = at + tag.size();
    while (end < bytes.size() && (std::isalnum(static_cast<unsigned char>(bytes[end])) || bytes[end] == '.' ||
                                  bytes[end] == '-'))
      ++end;
    std::string v = bytes.substr(at + tag.size(), end - at - tag.size());
    if (!v.empty() && std::isdigit(static_cast<unsigned char>(v[0])) && v.find('.') != std::string::npos) return v;
  }
  return "";
}

NetPlugin find_ofi_nccl_plugin(const SystemView& sys) {
  NetPlugin p;
  std::vector<std::string> names;
  if (const char* want = sys.getenv("NCCL_NET_PLUGIN"); want && *want) {
    const std::string w = want;
    if (w == "none") {
      p.disabled_by = "NCCL_NET_PLUGIN=none";
      return p;
    }
    if (w.find('/') != std::string::npos) names.push_back(w);  // a path: NCCL dlopens it as given
    else names.insert(names.end(), {"libnccl-net-" + w + ".so", w});
  }
  names.insert(names.end(), {"libnccl-net-ofi.so", "libnccl-net.so"});
  std::vector<std::string> loader_dirs;
  if (const char* ld = sys.getenv("LD_LIBRARY_PATH")) loader_dirs = split_nonempty(ld, ':');
  for (const char* d : {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib",
                        "/usr/lib", "/usr/local/lib"})
    loader_dirs.push_back(d);
  const std::vector<std::string> install_dirs = {
      "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu", "/opt/amazon/ofi-nccl/lib64", "/opt/amazon/ofi-nccl/lib",
      "/opt/aws-ofi-nccl/lib", "/usr/local/aws-ofi-nccl/lib"};
  auto search = [&](const std::vector<std::string>& dirs) -> std::string {
    for (const auto& name : names) {
      if (name.front() == '/') {
        if (sys.is_file(name)) return name;
        continue;
      }
      for (const auto& d : dirs)
        if (sys.is_file(d + "/" + name)) return d + "/" + name;
    }
    return "";
  };
  p.path = search(loader_dirs);
  p.on_loader_path = !p.path.empty();
  if (p.path.empty()) p.path = search(install_dirs);
  if (!p.path.empty()) p.version = ofi_nccl_version_in(sys.read_file(p.path).value_or(""));
  return p;
}

CudaToolkit find_cuda_toolkit(const SystemView& sys) {
  const char* home = sys.getenv("CUDA_HOME");
  const std::string root = home && *home ? home : "/usr/local/cuda";
  CudaToolkit t;
  t.path = root + "/version.json";
  std::smatch m;
  if (auto json = sys.read_file(t.path)) {
    static const std::regex cuda_entry(R"re("cuda"\s*:\s*\{[^}]*?"version"\s*:\s*"([0-9][0-9.]*)")re");
    if (std::regex_search(*json, m, cuda_entry)) t.version = m[1].str();
    return t;
  }
  if (auto txt = sys.read_file(root + "/version.txt")) {
    static const std::regex line(R"(CUDA Version\s+([0-9][0-9.]*))");
    t.path = root + "/version.txt";
    if (std::regex_search(*txt, m, line)) t.version = m[1].str();
    return t;
  }
  // A toolkit installed without those files (pip's nvidia-cuda-* wheels, some distributions):
  // the driver API header's CUDA_VERSION (13000 -> 13.0).
  if (auto header = sys.read_file(root + "/include/cuda.h")) {
    static const std::regex define(R"(#define\s+CUDA_VERSION\s+([0-9]+))");
    t.path = root + "/include/cuda.h";
    if (std::regex_search(*header, m, define)) {
      const int code = std::atoi(m[1].str().c_str());
      t.version = cat(code / 1000, ".", (code % 1000) / 10);
    }
  }
  return t;
}

int compare_versions(const std::string& a, const std::string& b) {
  auto numbers = [](const std::string& v) {
    std::vector<long> out;
    for (const auto& part : split_nonempty(v.substr(0, v.find_first_not_of("0123456789.")), '.'))
      out.push_back(std::strtol(part.c_str(), nullptr, 10));
    return out;
  };
  auto x = numbers(a), y = numbers(b);
  const size_t n = std::max(x.size(), y.size());
  x.resize(n, 0);
  y.resize(n, 0);
  for (size_t i = 0; i < n; ++i)
    if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
  return 0;
}

std::string human_bytes(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace me::doctor
