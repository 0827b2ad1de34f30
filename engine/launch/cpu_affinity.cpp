#include "engine/launch/cpu_affinity.h"

#include <dirent.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <sstream>

#include "engine/core/error.h"

namespace me::launch {
namespace {

int parse_cpu(const std::string& s, const std::string& text) {
  ME_CHECK(!s.empty() && s.size() < 7 && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); }),
           "CPU list '", text, "': expected numbers and ranges like 0-15,32-47");
  return std::stoi(s);
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

// Every thread of this process: a new thread inherits its creator's mask, but the ones already
// running (CUDA's, LibTorch's pools) keep theirs unless each is set.
int set_all_threads(const cpu_set_t& set) {
  int failures = 0;
  if (DIR* dir = ::opendir("/proc/self/task")) {
    while (const dirent* e = ::readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      const pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
      if (::sched_setaffinity(tid, sizeof set, &set) != 0) ++failures;
    }
    ::closedir(dir);
  } else if (::sched_setaffinity(0, sizeof set, &set) != 0) {
    ++failures;
  }
  return failures;
}

// sysfs names PCI devices in lower case; CUDA's bus ids are upper case.
std::string lower_case(std::string id) {
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return std::tolower(c); });
  return id;
}

}  // namespace

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::string trimmed = text;
  while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.back()))) trimmed.pop_back();
  std::stringstream in(trimmed);
  std::string part;
  while (std::getline(in, part, ',')) {
    const auto dash = part.find('-');
    const int lo = parse_cpu(part.substr(0, dash), text);
    const int hi = dash == std::string::npos ? lo : parse_cpu(part.substr(dash + 1), text);
    ME_CHECK(lo <= hi, "CPU list '", text, "': range ", part, " runs backwards");
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  ME_CHECK(!cpus.empty(), "CPU list '", text, "' names no CPU");
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::string device_cpu_list(const std::string& pci_bus_id, const std::string& sysfs) {
  std::ifstream f(sysfs + "/bus/pci/devices/" + lower_case(pci_bus_id) + "/local_cpulist");
  std::string text;
  if (!f || !std::getline(f, text)) return "";
  return text;
}

CpuBinding bind_to_device_cpus(const std::string& pci_bus_id, const std::string& sysfs, int share_index,
                               int share_count) {
  ME_CHECK(share_count >= 1 && share_index >= 0 && share_index < share_count, "bind_to_device_cpus: share ",
           share_index, " of ", share_count);
  CpuBinding b;
  b.cpus = allowed_cpus();
  const std::string id = lower_case(pci_bus_id);
  const std::string text = device_cpu_list(id, sysfs);
  if (text.empty()) {
    b.why = cat("not bound: ", sysfs, "/bus/pci/devices/", id, "/local_cpulist is unreadable");
    return b;
  }
  const auto local = parse_cpu_list(text);
  std::vector<int> both;
  std::set_intersection(b.cpus.begin(), b.cpus.end(), local.begin(), local.end(), std::back_inserter(both));
  if (both.empty()) {
    b.why = cat("not bound: none of the CPUs this process may use (", format_cpu_list(b.cpus), ") is local to GPU ", id,
                " (", format_cpu_list(local), ")");
    return b;
  }
  std::string share;
  if (const size_t slice = both.size() / static_cast<size_t>(share_count); share_count > 1 && slice >= 1) {
    const auto first = both.begin() + static_cast<std::ptrdiff_t>(slice * static_cast<size_t>(share_index));
    share = cat(" (slice ", share_index + 1, " of ", share_count, " of ", format_cpu_list(both), ", one per rank on them)");
    both = std::vector<int>(first, first + static_cast<std::ptrdiff_t>(slice));
  }
  if (both.size() == b.cpus.size()) {
    b.why = cat("already on GPU ", id, "'s CPUs ", format_cpu_list(b.cpus));
    return b;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : both)
    if (c < CPU_SETSIZE) CPU_SET(c, &set);
  if (const int failures = set_all_threads(set); failures > 0) {
    b.why = cat("not bound: sched_setaffinity refused ", failures, " thread(s)");
    return b;
  }
  b.bound = true;
  b.cpus = both;
  b.why = cat("bound to GPU ", id, "'s CPUs ", format_cpu_list(both), share);
  return b;
}

}  // namespace me::launch
