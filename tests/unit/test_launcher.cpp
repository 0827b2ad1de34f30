// The local launcher, with /bin/sh ranks. Every test bounds its own time (alarm) and checks
// that no process it started is left: the ranks write their PIDs to a file, and afterwards
// each PID must be gone and this process must have no child left to reap.
#include <catch2/catch.hpp>

#include <sched.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "engine/launch/free_port.h"
#include "engine/launch/launcher.h"
#include "engine/core/error.h"

using me::launch::LaunchOptions;
using me::launch::launch;
using Catch::Matchers::Contains;

namespace {

// A temporary file, removed at the end of the test.
struct TempFile {
  std::string path;
  TempFile() {
    char tmpl[] = "/tmp/me_launcher_testXXXXXX";
    int fd = ::mkstemp(tmpl);
    REQUIRE(fd >= 0);
    ::close(fd);
    path = tmpl;
  }
  ~TempFile() { ::unlink(path.c_str()); }
  std::string read() const {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::vector<pid_t> pids() const {
    std::vector<pid_t> out;
    std::istringstream in(read());
    for (long pid; in >> pid;) out.push_back(static_cast<pid_t>(pid));
    return out;
  }
};

struct Result {
  int rc = -1;
  std::string out, err;
  double seconds = 0;
};

// Runs launch() with our stdout/stderr redirected into temp files (files, not pipes, so a
// chatty run cannot block on a full pipe). alarm() turns a hung launcher into a failed run.
Result run(const LaunchOptions& opts) {
  TempFile out, err;
  std::cout.flush();
  std::fflush(nullptr);
  int saved_out = ::dup(STDOUT_FILENO), saved_err = ::dup(STDERR_FILENO);
  FILE* out_file = std::fopen(out.path.c_str(), "w");
  FILE* err_file = std::fopen(err.path.c_str(), "w");
  ::dup2(::fileno(out_file), STDOUT_FILENO);
  ::dup2(::fileno(err_file), STDERR_FILENO);
  auto restore = [&] {
    ::alarm(0);
    ::dup2(saved_out, STDOUT_FILENO);
    ::dup2(saved_err, STDERR_FILENO);
    ::close(saved_out);
    ::close(saved_err);
    std::fclose(out_file);
    std::fclose(err_file);
  };
  Result r;
  auto t0 = std::chrono::steady_clock::now();
  ::alarm(20);
  try {
    r.rc = launch(opts);
  } catch (...) {
    restore();
    throw;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  restore();
  r.out = out.read();
  r.err = err.read();
  return r;
}

LaunchOptions sh(int nproc, const std::string& script) {
  LaunchOptions o;
  o.nproc = nproc;
  o.argv = {"/bin/sh", "-c", script};
  o.grace_seconds = 0.5;
  return o;
}

// Shell snippet: wait until `file` has at least n lines (the other ranks wrote their PIDs).
std::string wait_lines(const TempFile& f, int n) {
  return "while [ $(wc -l < " + f.path + ") -lt " + std::to_string(n) +
         " ]; do sleep 0.02; done; ";
}

// Gone, or a zombie: an orphaned grandchild is reaped by PID 1, which in a container may
// never do it; a zombie runs nothing, so it counts as stopped. Waits up to a second, since
// the reaping of orphans happens asynchronously.
bool gone(pid_t pid) {
  for (int i = 0; i < 50; ++i) {
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    auto paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z')
      return true;
    ::usleep(20000);
  }
  return false;
}

void check_all_gone(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    INFO("pid " << pid);
    CHECK(gone(pid));
  }
  // Every rank has been reaped: this process has no child left.
  errno = 0;
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);
  CHECK(errno == ECHILD);
}

}  // namespace

TEST_CASE("ranks get their environment and prefixed output", "[launcher]") {
  Result r = run(sh(4,
                    "echo \"hello $RANK of $WORLD_SIZE local $LOCAL_RANK port $MASTER_PORT\"; "
                    "echo \"env $LOCAL_WORLD_SIZE $MASTER_ADDR $ME_LAUNCHED\""));
  REQUIRE(r.rc == 0);
  CHECK(r.err.empty());
  // The port comes from rank 0's line; every rank must agree on it.
  auto at = r.out.find("[rank 0] hello 0 of 4 local 0 port ");
  REQUIRE(at != std::string::npos);
  int port = std::stoi(r.out.substr(at + std::string("[rank 0] hello 0 of 4 local 0 port ").size()));
  CHECK(port > 0);
  CHECK(port < 65536);
  for (int rank = 0; rank < 4; ++rank) {
    std::string hello = me::cat("[rank ", rank, "] hello ", rank, " of 4 local ", rank,
                                " port ", port, "\n");
    CHECK_THAT(r.out, Contains(hello));
    CHECK_THAT(r.out, Contains(me::cat("[rank ", rank, "] env 4 127.0.0.1 1\n")));
  }
  check_all_gone({});
}

TEST_CASE("ranks share the CPUs for LibTorch's threads unless OMP_NUM_THREADS is set", "[launcher]") {
  const char* had = std::getenv("OMP_NUM_THREADS");
  const std::string saved = had ? had : "";
  ::unsetenv("OMP_NUM_THREADS");
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
  const int share = std::max(1, CPU_COUNT(&set) / 2);
  Result r = run(sh(2, "echo \"omp $OMP_NUM_THREADS\""));
  CHECK(r.rc == 0);
  for (int rank = 0; rank < 2; ++rank) CHECK_THAT(r.out, Contains(me::cat("[rank ", rank, "] omp ", share, "\n")));
  ::setenv("OMP_NUM_THREADS", "3", 1);  // the user's value wins
  r = run(sh(2, "echo \"omp $OMP_NUM_THREADS\""));
  CHECK_THAT(r.out, Contains("[rank 1] omp 3\n"));
  ::unsetenv("OMP_NUM_THREADS");
  r = run(sh(1, "echo \"omp [$OMP_NUM_THREADS]\""));  // one rank: LibTorch's own default
  CHECK_THAT(r.out, Contains("omp []"));
  if (had) ::setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  check_all_gone({});
}

TEST_CASE("an explicit master port is passed through", "[launcher]") {
  LaunchOptions o = sh(2, "echo \"port $MASTER_PORT\"");
  o.master_port = 29517;
  Result r = run(o);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Contains("[rank 0] port 29517\n"));
  CHECK_THAT(r.out, Contains("[rank 1] port 29517\n"));
}

TEST_CASE("stdout and stderr are relayed to stdout and stderr", "[launcher]") {
  Result r = run(sh(2, "echo out $RANK; echo err $RANK >&2"));
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Contains("[rank 0] out 0\n"));
  CHECK_THAT(r.out, Contains("[rank 1] out 1\n"));
  CHECK_THAT(r.err, Contains("[rank 0] err 0\n"));
  CHECK_THAT(r.err, Contains("[rank 1] err 1\n"));
  CHECK(r.out.find("err") == std::string::npos);
}

TEST_CASE("a failing rank stops the others", "[launcher]") {
  TempFile pids;
  Result r = run(sh(4, "if [ \"$RANK\" = 2 ]; then " + wait_lines(pids, 3) +
                           "echo dying >&2; exit 3; fi; echo $$ >> " + pids.path +
                           "; exec sleep 60"));
  CHECK(r.rc == 1);
  CHECK_THAT(r.err, Contains("megaengine: rank 2 exited with status 3; stopping the other 3 ranks\n"));
  // The rank's last words come before the verdict.
  CHECK(r.err.find("[rank 2] dying") < r.err.find("megaengine: rank 2"));
  CHECK(r.seconds < 0.5 + 2.5);
  REQUIRE(pids.pids().size() == 3);
  check_all_gone(pids.pids());
}

TEST_CASE("a rank killed by a signal is reported with the signal's name", "[launcher]") {
  TempFile pids;
  Result r = run(sh(2, "if [ \"$RANK\" = 1 ]; then " + wait_lines(pids, 1) +
                           "kill -9 $$; fi; echo $$ >> " + pids.path + "; exec sleep 60"));
  CHECK(r.rc == 1);
  CHECK_THAT(r.err,
             Contains("megaengine: rank 1 was killed by signal 9 (SIGKILL); stopping the other 1 rank\n"));
  check_all_gone(pids.pids());
}

TEST_CASE("a rank that ignores SIGTERM is killed after the grace period", "[launcher]") {
  TempFile pids;
  LaunchOptions o = sh(2, "if [ \"$RANK\" = 1 ]; then " + wait_lines(pids, 1) +
                              "exit 1; fi; trap '' TERM; echo $$ >> " + pids.path +
                              "; exec sleep 60");
  o.grace_seconds = 0.5;
  Result r = run(o);
  CHECK(r.rc == 1);
  CHECK_THAT(r.err, Contains("rank 1 exited with status 1"));
  CHECK(r.seconds >= 0.5);
  CHECK(r.seconds < 0.5 + 2.5);
  REQUIRE(pids.pids().size() == 1);
  check_all_gone(pids.pids());
}

TEST_CASE("stopping a rank stops the processes it started", "[launcher]") {
  TempFile pids;
  // Rank 0 is a shell waiting on a background sleep: the sleep is a grandchild of the launcher.
  Result r = run(sh(2, "if [ \"$RANK\" = 1 ]; then " + wait_lines(pids, 2) +
                           "exit 1; fi; sleep 60 & echo $! >> " + pids.path + "; echo $$ >> " +
                           pids.path + "; wait"));
  CHECK(r.rc == 1);
  CHECK(r.seconds < 0.5 + 2.5);
#ifdef __linux__
  // SIGTERM suffices, and the launcher reaps the orphaned sleep itself, so the group empties
  // well before the grace period even where PID 1 never reaps.
  CHECK(r.seconds < 0.45);
#endif
  REQUIRE(pids.pids().size() == 2);
  check_all_gone(pids.pids());
}

TEST_CASE("processes a successful rank leaves behind are stopped", "[launcher]") {
  TempFile pids;
  Result r = run(sh(1, "sleep 60 & echo $! >> " + pids.path + "; exit 0"));
  CHECK(r.rc == 0);
  CHECK(r.seconds < 0.5 + 2.5);
  REQUIRE(pids.pids().size() == 1);
  check_all_gone(pids.pids());
}

TEST_CASE("a program that does not exist", "[launcher]") {
  LaunchOptions o;
  o.nproc = 2;
  o.argv = {"/nonexistent/me-no-such-program", "--flag"};
  Result r = run(o);
  CHECK(r.rc == 1);
  CHECK_THAT(r.err, Contains("megaengine: cannot run '/nonexistent/me-no-such-program': "
                             "No such file or directory"));
  CHECK_THAT(r.err, Contains("exited with status 127"));
  check_all_gone({});
}

TEST_CASE("bad options are rejected", "[launcher]") {
  LaunchOptions o = sh(1, "true");
  o.nproc = 0;
  CHECK_THROWS_WITH(launch(o), Contains("--nproc must be a positive integer, got 0"));
  o.nproc = -3;
  CHECK_THROWS_AS(launch(o), me::Error);
  o.nproc = 1;
  o.argv.clear();
  CHECK_THROWS_WITH(launch(o), Contains("no program to launch"));
  o = sh(1, "true");
  o.master_port = 70000;
  CHECK_THROWS_WITH(launch(o), Contains("--master-port must be in 0..65535"));
  o = sh(1, "true");
  o.grace_seconds = -1;
  CHECK_THROWS_AS(launch(o), me::Error);
}

TEST_CASE("a last line without a newline is still printed", "[launcher]") {
  Result r = run(sh(1, "printf 'no newline'; printf 'err tail' >&2"));
  REQUIRE(r.rc == 0);
  CHECK(r.out == "[rank 0] no newline\n");
  CHECK(r.err == "[rank 0] err tail\n");

  LaunchOptions o = sh(1, "printf 'a\\nb'");
  o.prefix_output = false;
  r = run(o);
  REQUIRE(r.rc == 0);
  CHECK(r.out == "a\nb\n");
}

TEST_CASE("SIGINT and SIGTERM to the launcher are forwarded to the ranks", "[launcher]") {
  for (auto [sig, name, code] : {std::tuple{SIGINT, "SIGINT", 130}, std::tuple{SIGTERM, "SIGTERM", 143}}) {
    INFO(name);
    TempFile pids;
    // Rank 1 signals the launcher (its parent: this test process) once both ranks are up.
    Result r = run(sh(2, "echo $$ >> " + pids.path + "; if [ \"$RANK\" = 1 ]; then " +
                             wait_lines(pids, 2) + "kill -" + std::string(name).substr(3) +
                             " $PPID; fi; exec sleep 60"));
    CHECK(r.rc == code);
    CHECK_THAT(r.err, Contains(std::string("megaengine: got ") + name));
    CHECK(r.seconds < 0.5 + 2.5);
    REQUIRE(pids.pids().size() == 2);
    check_all_gone(pids.pids());
  }
}

TEST_CASE("pick_free_port", "[launcher]") {
  int port = me::launch::pick_free_port("127.0.0.1");
  CHECK(port > 0);
  CHECK(port < 65536);
  // Below the ephemeral range (where the kernel leaves room for it): no rank's outgoing
  // connection can be given the store's port as its source port.
  const auto [first, last] = me::launch::ephemeral_port_range();
  CHECK(first <= last);
  if (first > 11000) CHECK(port < first);
  // TEST-NET-1 is never an address of this machine: binding fails with a clear message.
  CHECK_THROWS_WITH(me::launch::pick_free_port("192.0.2.1"), Contains("cannot bind a TCP port"));
  CHECK(me::launch::signal_name(SIGSEGV) == "SIGSEGV");
  CHECK(me::launch::signal_name(77) == "signal 77");
}

TEST_CASE("every rank gets the same fresh job token, or the inherited one", "[launcher]") {
  Result a = run(sh(2, "echo \"token $ME_JOB_TOKEN\""));
  REQUIRE(a.rc == 0);
  const auto token_of = [](const std::string& out, int rank) {
    const std::string tag = me::cat("[rank ", rank, "] token ");
    const auto at = out.find(tag);
    return at == std::string::npos ? std::string() : out.substr(at + tag.size(), out.find('\n', at) - at - tag.size());
  };
  const std::string t0 = token_of(a.out, 0);
  CHECK(t0.size() == 64);
  CHECK(token_of(a.out, 1) == t0);
  Result b = run(sh(1, "echo \"token $ME_JOB_TOKEN\""));
  CHECK(token_of(b.out, 0).size() == 64);
  CHECK(token_of(b.out, 0) != t0);  // a new launch, a new token
  ::setenv("ME_JOB_TOKEN", "inherited-token-0123456789", 1);
  Result c = run(sh(1, "echo \"token $ME_JOB_TOKEN\""));
  ::unsetenv("ME_JOB_TOKEN");
  CHECK(token_of(c.out, 0) == "inherited-token-0123456789");
}

TEST_CASE("a stopped rank is woken to take its SIGTERM, not left for the grace period", "[launcher]") {
  TempFile pids;
  LaunchOptions o = sh(2, "echo $$ >> " + pids.path + "; if [ \"$RANK\" = 1 ]; then kill -STOP $$; exec sleep 60; fi; " +
                              wait_lines(pids, 2) + "sleep 0.3; exit 3");
  o.grace_seconds = 15;
  Result r = run(o);
  CHECK(r.rc == 1);
  CHECK_THAT(r.err, Contains("megaengine: rank 0 exited with status 3; stopping the other 1 rank\n"));
  CHECK(r.seconds < 5);  // SIGKILL would come only after 15 s
  check_all_gone(pids.pids());
}
