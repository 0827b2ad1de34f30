// Slurm host lists (SLURM_JOB_NODELIST): expand_hostlist either expands or throws me::Error;
// anything else (a crash, another exception, a runaway allocation) is a finding.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "engine/launch/hostlist.h"
#include "engine/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  try {
    const auto hosts = me::launch::expand_hostlist(spec);
    if (hosts.empty()) std::abort();  // a list that parses names at least one host
    for (const auto& h : hosts)
      if (h.find_first_of(",[]") != std::string::npos) std::abort();  // syntax never leaks into a name
    if (me::launch::first_host(spec) != hosts.front()) std::abort();
  } catch (const me::Error&) {
  }
  return 0;
}
