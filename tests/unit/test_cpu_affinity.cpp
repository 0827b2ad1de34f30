// comm.cpu_bind's pieces: the kernel's CPU lists, and binding this process to a device's CPUs
// read from a sysfs tree made here (the real one has no GPU on CI).
#include <catch2/catch.hpp>

#include <dirent.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/error.h"
#include "engine/launch/cpu_affinity.h"
#include "temp_dir.h"

using me::launch::bind_to_device_cpus;
using me::launch::format_cpu_list;
using me::launch::parse_cpu_list;

namespace {

std::vector<int> affinity_of(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(tid, sizeof set, &set) == 0);
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

// Every thread of this process back on `set` (those other tests left running too).
void restore_all_threads(const cpu_set_t& set) {
  DIR* dir = ::opendir("/proc/self/task");
  REQUIRE(dir != nullptr);
  while (const dirent* e = ::readdir(dir))
    if (e->d_name[0] != '.') ::sched_setaffinity(static_cast<pid_t>(std::atoi(e->d_name)), sizeof set, &set);
  ::closedir(dir);
  REQUIRE(affinity_of(0).size() == static_cast<size_t>(CPU_COUNT(&set)));
}

// A sysfs tree whose PCI device `id` lists `cpus` as its local CPUs.
void fake_device(const TempDir& root, const std::string& id, const std::string& cpus) {
  std::string dir = root.path;
  for (const char* part : {"/bus", "/pci", "/devices"}) ::mkdir((dir += part).c_str(), 0755);
  ::mkdir((dir += "/" + id).c_str(), 0755);
  std::ofstream(dir + "/local_cpulist") << cpus << "\n";
}

}  // namespace

TEST_CASE("CPU lists are read and written as the kernel writes them", "[cpu_affinity]") {
  CHECK(parse_cpu_list("0-3,8\n") == std::vector<int>{0, 1, 2, 3, 8});
  CHECK(parse_cpu_list("5") == std::vector<int>{5});
  CHECK(parse_cpu_list("8,0-1,1") == std::vector<int>{0, 1, 8});
  CHECK(format_cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  CHECK(format_cpu_list({}) == "");
  CHECK_THROWS_WITH(parse_cpu_list("0-x"), Catch::Contains("expected numbers and ranges"));
  CHECK_THROWS_WITH(parse_cpu_list("7-3"), Catch::Contains("runs backwards"));
  CHECK_THROWS_WITH(parse_cpu_list(""), Catch::Contains("names no CPU"));
}

TEST_CASE("a process is bound to its device's CPUs, never widened, and every thread follows", "[cpu_affinity]") {
  const auto original = affinity_of(0);
  REQUIRE(!original.empty());
  TempDir root;
  const std::string id = "0000:1b:00.0";

  SECTION("no list for the device: nothing changes") {
    const auto b = bind_to_device_cpus(id, root.path);
    CHECK_FALSE(b.bound);
    CHECK_THAT(b.why, Catch::Contains("local_cpulist is unreadable"));
    CHECK(affinity_of(0) == original);
  }
  SECTION("the device's CPUs are all the process has: nothing changes") {
    fake_device(root, id, format_cpu_list(original));
    const auto b = bind_to_device_cpus("0000:1B:00.0", root.path);  // CUDA writes the bus id in capitals
    CHECK_FALSE(b.bound);
    CHECK_THAT(b.why, Catch::Contains("already on GPU 0000:1b:00.0"));
  }
  SECTION("none of the device's CPUs is allowed: nothing changes") {
    fake_device(root, id, std::to_string(original.back() + 1));
    const auto b = bind_to_device_cpus(id, root.path);
    CHECK_FALSE(b.bound);
    CHECK_THAT(b.why, Catch::Contains("is local to GPU"));
    CHECK(affinity_of(0) == original);
  }
  if (original.size() > 1) {
    SECTION("narrowed to the allowed CPUs of the device, on threads started before and after") {
      std::mutex m;
      std::condition_variable cv;
      bool go = false;
      pid_t before_tid = 0;
      std::vector<int> before_seen;
      std::thread before([&] {
        std::unique_lock<std::mutex> lock(m);
        before_tid = static_cast<pid_t>(::syscall(SYS_gettid));
        cv.notify_all();
        cv.wait(lock, [&] { return go; });
        before_seen = affinity_of(0);
      });
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return before_tid != 0; });
      }
      // the first allowed CPU and one the process may not use
      fake_device(root, id, std::to_string(original.front()) + "," + std::to_string(original.back() + 1));
      const auto b = bind_to_device_cpus(id, root.path);
      {
        std::lock_guard<std::mutex> lock(m);
        go = true;
      }
      cv.notify_all();
      before.join();
      std::vector<int> after_seen;
      std::thread([&] { after_seen = affinity_of(0); }).join();
      const auto mine = affinity_of(0);
      // back as it was, on every thread, before anything is checked
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int c : original) CPU_SET(c, &set);
      restore_all_threads(set);
      CHECK(b.bound);
      CHECK(b.cpus == std::vector<int>{original.front()});
      CHECK_THAT(b.why, Catch::Contains("bound to GPU 0000:1b:00.0's CPUs " + std::to_string(original.front())));
      CHECK(mine == b.cpus);
      CHECK(before_seen == b.cpus);
      CHECK(after_seen == b.cpus);
    }
    SECTION("ranks whose GPUs have the same CPUs each take their own slice") {
      fake_device(root, id, format_cpu_list(original));
      const auto b = bind_to_device_cpus(id, root.path, 1, 2);  // the second of two ranks
      const auto mine = affinity_of(0);
      cpu_set_t set;
      CPU_ZERO(&set);
      for (int c : original) CPU_SET(c, &set);
      restore_all_threads(set);
      const size_t half = original.size() / 2;
      const std::vector<int> second(original.begin() + static_cast<std::ptrdiff_t>(half),
                                    original.begin() + static_cast<std::ptrdiff_t>(2 * half));
      CHECK(b.bound);
      CHECK(b.cpus == second);
      CHECK(mine == second);
      CHECK_THAT(b.why, Catch::Contains("slice 2 of 2"));
      CHECK_THROWS_WITH(bind_to_device_cpus(id, root.path, 2, 2), Catch::Contains("share 2 of 2"));
    }
  }
}
