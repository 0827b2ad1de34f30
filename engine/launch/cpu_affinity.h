// Binds a rank's threads to the CPUs beside its GPU (comm.cpu_bind = "gpu"): the CPUs of the
// NUMA node the GPU hangs off, as the kernel lists them in /sys/bus/pci/devices/<bus id>/local_cpulist.
// A rank whose threads run on the far socket pays a cross-socket hop on every kernel launch and
// copy it queues, and at tp 4 the step waits for the slowest rank's host (bench/RESULTS.md,
// nineteenth session: one rank's calls cost 10-35% more than the others'). Torch-free.
#pragma once
#include <string>
#include <vector>

namespace me::launch {

// "0-15,32-47" -> {0..15, 32..47}; throws me::Error on anything else, naming the text.
std::vector<int> parse_cpu_list(const std::string& text);

struct CpuBinding {
  bool bound = false;
  std::vector<int> cpus;  // what the threads may run on now
  std::string why;        // what was done, or why nothing was, for the log
};

// Restricts every thread of this process (and those it starts later) to the CPUs local to the
// PCI device `pci_bus_id` ("0000:1B:00.0", any case) that its affinity already allows: those
// Slurm's --cpu-bind or taskset left it are narrowed, never widened. When `share_count` ranks
// of this node have GPUs on the same CPUs, each takes its own contiguous slice of them (the
// `share_index`-th of `share_count`), as Slurm's --cpu-bind=cores would: threads that stay on
// their cores keep their caches, and two ranks' launch threads never share a core's
// hyperthreads. Nothing changes (bound = false, why says it) where sysfs has no list for the
// device, or the CPUs left are none or all the process has. `sysfs` is the root to read (tests
// point it elsewhere).
CpuBinding bind_to_device_cpus(const std::string& pci_bus_id, const std::string& sysfs = "/sys", int share_index = 0,
                               int share_count = 1);

// The CPUs local to a PCI device as sysfs lists them ("" where it does not).
std::string device_cpu_list(const std::string& pci_bus_id, const std::string& sysfs = "/sys");

// A short form of a CPU list for the log: {0,1,2,3,8} -> "0-3,8".
std::string format_cpu_list(const std::vector<int>& cpus);

}  // namespace me::launch
