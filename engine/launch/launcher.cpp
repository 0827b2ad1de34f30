#include "engine/launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>

#include "engine/launch/free_port.h"
#include "engine/launch/job_token.h"
#include "engine/core/error.h"
#include "engine/core/exit_status.h"

extern char** environ;

namespace me::launch {
namespace {

using Clock = std::chrono::steady_clock;

// A line longer than this is written out in pieces, so a child that never prints a newline
// (a progress bar drawn with '\r') cannot make the launcher buffer without bound.
constexpr std::size_t kMaxLine = 1 << 20;

// After SIGKILL, how long to wait for the ranks' process groups to empty before giving up on
// them (a process in uninterruptible sleep, or a zombie nobody reaps, can outlive SIGKILL).
constexpr double kAfterKillSeconds = 1.0;

// How often the main loop wakes up even without events; it rechecks children and deadlines.
constexpr int kTickMs = 100;

// After every process is gone, how long to wait for the pipes to reach EOF. Only a process
// that escaped its rank's process group (setsid) can hold them open longer.
constexpr double kDrainSeconds = 1.0;

std::string errno_text(int err) { return std::strerror(err); }

// ---- Signals -----------------------------------------------------------------------------

// Self-pipe: a signal handler may only do async-signal-safe work, so it writes the signal
// number here and the main loop, woken up by poll(), does the rest.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  // If the pipe were full the wakeup is dropped; the loop rechecks children every tick anyway.
  ssize_t ignored = ::write(g_signal_pipe[1], &byte, 1);
  (void)ignored;
  errno = saved;
}

void set_flags(int fd, int fd_flags, int fl_flags) {
  if (fd_flags) ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | fd_flags);
  if (fl_flags) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | fl_flags);
}

// A pipe whose ends are close-on-exec, so no rank inherits another rank's pipes.
void make_pipe(int fds[2]) {
  if (::pipe(fds) != 0) fail("cannot create a pipe: ", errno_text(errno));
  set_flags(fds[0], FD_CLOEXEC, 0);
  set_flags(fds[1], FD_CLOEXEC, 0);
}

// Installs the launcher's signal handling for the duration of one launch and restores the
// caller's afterwards (tests and the REPL run launch() inside a longer-lived process).
class SignalScope {
 public:
  SignalScope() {
    ME_CHECK(g_signal_pipe[0] == -1, "launch() is already running in this process");
    make_pipe(g_signal_pipe);
    set_flags(g_signal_pipe[0], 0, O_NONBLOCK);
    set_flags(g_signal_pipe[1], 0, O_NONBLOCK);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    // SIGCHLD gets a handler too: it wakes poll() at once when a rank exits, and it undoes a
    // caller's SIG_IGN, under which the kernel would reap our children before waitpid could.
    for (int i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
    // A closed stdout (`megaengine ... | head`) must not kill the launcher and orphan the
    // ranks; writes then fail with EPIPE and the output is dropped.
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGPIPE, &ign, &old_pipe_);
  }
  ~SignalScope() {
    for (int i = 0; i < kCount; ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
    g_signal_pipe[0] = g_signal_pipe[1] = -1;
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  static constexpr int kCount = 4;
  static constexpr int kSignals[kCount] = {SIGINT, SIGTERM, SIGUSR1, SIGCHLD};

 private:
  struct sigaction old_[kCount] {};
  struct sigaction old_pipe_ {};
};

// Orphans of a rank (processes whose rank exited before them) are normally adopted by PID 1.
// On Linux the launcher adopts them instead, for the length of the launch, so that it can reap
// them: a container's PID 1 often never reaps, and its zombies would look like live members
// of the rank's process group until the grace period ran out. Elsewhere this is a no-op.
class AdoptOrphans {
 public:
#ifdef __linux__
  AdoptOrphans() {
    ::prctl(PR_GET_CHILD_SUBREAPER, &old_);
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }
  ~AdoptOrphans() { ::prctl(PR_SET_CHILD_SUBREAPER, old_); }

 private:
  int old_ = 0;
#endif
};

// ---- Output relay ------------------------------------------------------------------------

// Writes everything, retrying on EINTR and waiting out a non-blocking destination. Gives up
// silently on real errors (EPIPE): losing output must not stop the supervision of the ranks.
void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd pfd{fd, POLLOUT, 0};
        ::poll(&pfd, 1, kTickMs);
        continue;
      }
      return;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

// One of a rank's output pipes, with the incomplete line read so far.
struct Stream {
  int fd = -1;      // read end; -1 once closed
  int out_fd = -1;  // where its lines go: our stdout or stderr
  std::string partial;
};

enum class Pump { kData, kEmpty, kClosed };

// Appends "prefix + text + \n" to out.
void add_line(std::string& out, const std::string& prefix, const char* text, std::size_t n) {
  out += prefix;
  out.append(text, n);
  out += '\n';
}

void close_stream(Stream& s, const std::string& prefix) {
  if (s.fd < 0) return;
  if (!s.partial.empty()) {  // the child's last line had no newline: print it anyway
    std::string out;
    add_line(out, prefix, s.partial.data(), s.partial.size());
    write_all(s.out_fd, out.data(), out.size());
    s.partial.clear();
  }
  ::close(s.fd);
  s.fd = -1;
}

// Reads what is available and writes out the complete lines, all in one write() so that lines
// of different ranks never interleave mid-line.
Pump pump(Stream& s, const std::string& prefix) {
  if (s.fd < 0) return Pump::kClosed;
  char chunk[65536];
  ssize_t n = ::read(s.fd, chunk, sizeof chunk);
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return Pump::kEmpty;
  if (n <= 0) {
    close_stream(s, prefix);
    return Pump::kClosed;
  }
  s.partial.append(chunk, static_cast<std::size_t>(n));
  std::string out;
  std::size_t start = 0;
  for (std::size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1)
    add_line(out, prefix, s.partial.data() + start, nl - start);
  s.partial.erase(0, start);
  if (s.partial.size() > kMaxLine) {
    add_line(out, prefix, s.partial.data(), s.partial.size());
    s.partial.clear();
  }
  if (!out.empty()) write_all(s.out_fd, out.data(), out.size());
  return Pump::kData;
}

// Prints one line of the launcher's own to stderr (unbuffered, so it lands in order with the
// relayed lines, which are written with write(2) too).
void say(const std::string& text) {
  std::string line = "megaengine: " + text + "\n";
  write_all(STDERR_FILENO, line.data(), line.size());
}

std::string plural_ranks(int n) { return cat(n, n == 1 ? " rank" : " ranks"); }

// ---- Ranks -------------------------------------------------------------------------------

struct Rank {
  int rank = 0;
  pid_t pid = -1;  // also its process group id
  bool running = false;
  int status = 0;  // from waitpid, valid once !running
  std::string prefix;
  Stream out, err;
};

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

std::string describe_exit(const Rank& r) {
  if (WIFSIGNALED(r.status)) {
    int sig = WTERMSIG(r.status);
    return cat("rank ", r.rank, " was killed by signal ", sig, " (", signal_name(sig), ")");
  }
  return cat("rank ", r.rank, " exited with status ", WEXITSTATUS(r.status));
}

// CPUs this process may run on (its affinity mask: what Slurm or taskset left it).
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
}

// The environment of one rank: ours, minus stale values of the launcher's variables (from an
// outer launcher or the user's shell), plus this rank's.
std::vector<std::string> rank_environment(const LaunchOptions& opts, int port, int rank) {
  std::vector<std::pair<std::string, std::string>> vars = {
      {"ME_JOB_TOKEN", opts.job_token},
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(opts.nproc)},
      {"LOCAL_RANK", std::to_string(rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(opts.nproc)},
      {"MASTER_ADDR", opts.master_addr},
      {"MASTER_PORT", std::to_string(port)},
      {"ME_LAUNCHED", "1"},  // a rank that runs megaengine again must not launch again
      // The launcher owns the rank prefix of its ranks' lines: their log adds none of its own.
      {"ME_OUTPUT_PREFIXED", opts.prefix_output ? "1" : "0"},
  };
  // Each rank's share of the CPUs this launcher may use, for LibTorch's CPU thread pool, unless
  // the user set it: as torchrun does and slurm/train.sbatch (--cpus-per-task). Without it every
  // rank starts a pool as large as the machine, nproc pools in all, whose spinning workers take
  // cycles from the threads that launch each rank's kernels.
  if (opts.nproc > 1 && !std::getenv("OMP_NUM_THREADS")) {
    vars.emplace_back("OMP_NUM_THREADS", std::to_string(std::max(1, usable_cpus() / opts.nproc)));
  }
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry = *e;
    std::string key = entry.substr(0, entry.find('='));
    bool ours = std::any_of(vars.begin(), vars.end(), [&](const auto& v) { return v.first == key; });
    if (!ours) env.push_back(std::move(entry));
  }
  for (const auto& [key, value] : vars) env.push_back(key + "=" + value);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Makes fd become target in a child, clearing close-on-exec even when fd already is target
// (dup2 onto itself leaves the flag alone).
void move_fd(int fd, int target) {
  if (fd == target)
    ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) & ~FD_CLOEXEC);
  else
    ::dup2(fd, target);
}

class Launcher {
 public:
  Launcher(const LaunchOptions& opts, int port) : opts_(opts), port_(port) {}

  ~Launcher() {
    // Only reached with live children when starting failed half way: never leave them behind.
    for (auto& r : ranks_) {
      if (r.running) {
        ::kill(-r.pid, SIGKILL);
        while (::waitpid(r.pid, nullptr, 0) < 0 && errno == EINTR) {
        }
      }
      close_stream(r.out, r.prefix);
      close_stream(r.err, r.prefix);
    }
  }

  void start_all() {
    // Ranks read stdin from /dev/null: a rank in a background process group that read the
    // terminal would be stopped by SIGTTIN and hang the whole job.
    int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) set_flags(null_fd, FD_CLOEXEC, 0);
    try {
      for (int i = 0; i < opts_.nproc; ++i) start(i, null_fd);
    } catch (...) {
      if (null_fd >= 0) ::close(null_fd);
      throw;
    }
    if (null_fd >= 0) ::close(null_fd);
  }

  int run() {
    while (true) {
      reap();
      auto now = Clock::now();
      bool groups = any_group_alive();
      if (!stopping_ && !any_running() && groups) {
        // Every rank exited but something it started is still around: stop it too.
        say("the ranks left processes behind; stopping them");
        begin_stop(SIGTERM);
      }
      if (stopping_ && !killed_ && (any_running() || groups) && now >= kill_deadline_)
        kill_all(SIGKILL);
      bool waiting = any_running() || (groups && !(killed_ && now >= give_up_));
      if (!waiting) {
        if (!any_stream_open()) break;
        if (!drain_deadline_) drain_deadline_ = now + seconds(kDrainSeconds);
        if (now >= *drain_deadline_) break;
      }
      wait_for_events(now);
    }
    for (auto& r : ranks_) {
      close_stream(r.out, r.prefix);
      close_stream(r.err, r.prefix);
    }
    if (result_) return *result_;
    if (const int common = common_status(); common >= 0) return common;
    return forwarded_ ? 128 + forwarded_ : 1;
  }

  // The ranks' exit status when they all exited with the same one (0; kExitRequeue after a
  // signal and a save; kExitNonFinite), else -1.
  int common_status() const {
    const auto& first = ranks_.front();
    const bool same = std::all_of(ranks_.begin(), ranks_.end(), [&](const Rank& r) {
      return WIFEXITED(r.status) && WEXITSTATUS(r.status) == WEXITSTATUS(first.status);
    });
    return same && WIFEXITED(first.status) ? WEXITSTATUS(first.status) : -1;
  }

 private:
  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  void start(int i, int null_fd) {
    Rank r;
    r.rank = i;
    r.prefix = opts_.prefix_output ? cat("[rank ", i, "] ") : "";
    int out[2], err[2];
    make_pipe(out);
    try {
      make_pipe(err);
    } catch (...) {
      ::close(out[0]);
      ::close(out[1]);
      throw;
    }
    // Everything the child needs is built before fork: after fork only async-signal-safe
    // calls are allowed (the parent may have threads, e.g. LibTorch's).
    std::vector<std::string> env = rank_environment(opts_, port_, i);
    std::vector<char*> envp = c_strings(env);
    std::vector<std::string> args = opts_.argv;
    std::vector<char*> argv = c_strings(args);
    std::string cannot_run = "megaengine: cannot run '" + opts_.argv[0] + "': ";

    // Block our signals across fork so that the child cannot run our handler (which writes to
    // the launcher's self-pipe) before it has reset them.
    sigset_t block, old_mask;
    sigemptyset(&block);
    for (int sig : SignalScope::kSignals) sigaddset(&block, sig);
    ::sigprocmask(SIG_BLOCK, &block, &old_mask);
    pid_t pid = ::fork();
    if (pid == 0) {
      for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGCHLD, SIGPIPE}) ::signal(sig, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      ::setpgid(0, 0);  // own process group: kill(-pid) reaches everything this rank starts
      if (null_fd >= 0) move_fd(null_fd, STDIN_FILENO);
      move_fd(out[1], STDOUT_FILENO);
      move_fd(err[1], STDERR_FILENO);
      environ = envp.data();
      ::execvp(argv[0], argv.data());
      const char* why = std::strerror(errno);
      ssize_t ignored = ::write(STDERR_FILENO, cannot_run.data(), cannot_run.size());
      ignored = ::write(STDERR_FILENO, why, std::strlen(why));
      ignored = ::write(STDERR_FILENO, "\n", 1);
      (void)ignored;
      ::_exit(127);
    }
    int fork_errno = errno;
    ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    ::close(out[1]);
    ::close(err[1]);
    if (pid < 0) {
      ::close(out[0]);
      ::close(err[0]);
      fail("cannot start rank ", i, ": fork failed: ", errno_text(fork_errno));
    }
    // Also set the group from this side, so that a kill(-pid) right after fork cannot miss a
    // child that has not run its own setpgid yet. EACCES (it already exec'd) is fine.
    ::setpgid(pid, pid);
    r.pid = pid;
    r.running = true;
    r.out = Stream{out[0], STDOUT_FILENO, {}};
    r.err = Stream{err[0], STDERR_FILENO, {}};
    set_flags(out[0], 0, O_NONBLOCK);
    set_flags(err[0], 0, O_NONBLOCK);
    ranks_.push_back(std::move(r));
  }

  // Collects the ranks that exited (and adopted orphans of their groups) and reports the
  // first failure. Waiting by process group never reaps a child the caller started itself.
  void reap() {
    const Rank* first_failure = nullptr;
    for (auto& r : ranks_) {
      int status = 0;
      pid_t got;
      do {  // other pids of the group are adopted orphans: reap them and forget them
        got = ::waitpid(-r.pid, &status, WNOHANG);
      } while (got > 0 && got != r.pid);
      if (!r.running) continue;
      if (got != r.pid) {  // asking for the pid itself too keeps this right whatever its group
        got = ::waitpid(r.pid, &status, WNOHANG);
        if (got == 0 || (got < 0 && errno == EINTR)) continue;
      }
      r.running = false;
      r.status = got < 0 ? 0 : status;  // ECHILD: someone else reaped it; nothing to report
      // Relay what it wrote before exiting, so its last words precede our verdict. Bounded,
      // because a leftover process of its group may still be writing.
      for (int k = 0; k < 16 && pump(r.out, r.prefix) == Pump::kData; ++k) {
      }
      for (int k = 0; k < 16 && pump(r.err, r.prefix) == Pump::kData; ++k) {
      }
      // A rank that stopped on purpose (saved on a signal, or too many non-finite steps) is
      // not a failure: every rank stops the same way at the same step.
      const bool deliberate = WIFEXITED(status) &&
                              (WEXITSTATUS(status) == kExitRequeue || WEXITSTATUS(status) == kExitNonFinite);
      if (got > 0 && failed(status) && !deliberate && !first_failure) first_failure = &r;
    }
    if (!first_failure || stopping_) return;
    int others = static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(),
                                                [](const Rank& r) { return r.running; }));
    std::string line = describe_exit(*first_failure);
    if (others > 0) line += "; stopping the other " + plural_ranks(others);
    say(line);
    result_ = 1;
    begin_stop(SIGTERM);
  }

  // SIGTERM, SIGUSR1 and a first SIGINT (Ctrl-C) give the ranks time to save a checkpoint and
  // stop by themselves (save_grace_seconds); a second signal kills them.
  void on_launcher_signal(int sig) {
    if (!stopping_) {
      int n = static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(),
                                             [](const Rank& r) { return r.running; }));
      say(cat("got ", signal_name(sig), "; forwarding it to ", plural_ranks(n)));
      forwarded_ = sig;
      begin_stop(sig, opts_.save_grace_seconds);
    } else if (!killed_) {
      // A second Ctrl-C means the user does not want to wait for the grace period.
      say(cat("got ", signal_name(sig), " again; killing the ranks"));
      kill_all(SIGKILL);
    }
  }

  // Signals every rank's process group, exited ranks included (their leftovers share it). A
  // stopped process (SIGSTOP, a debugger detached badly) only queues the signal: SIGCONT lets
  // it act on it now instead of at the SIGKILL after the grace period.
  void begin_stop(int sig) { begin_stop(sig, opts_.grace_seconds); }
  void begin_stop(int sig, double grace) {
    stopping_ = true;
    kill_deadline_ = Clock::now() + seconds(grace);
    for (auto& r : ranks_) {
      ::kill(-r.pid, sig);
      ::kill(-r.pid, SIGCONT);
    }
  }

  void kill_all(int sig) {
    for (auto& r : ranks_) ::kill(-r.pid, sig);
    killed_ = true;
    give_up_ = Clock::now() + seconds(kAfterKillSeconds);
  }

  bool any_running() const {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; });
  }

  // Whether some process is still in a rank's group. Only meaningful once the rank itself has
  // been reaped; EPERM (a member changed user) counts as alive.
  bool any_group_alive() const {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) {
      return !r.running && (::kill(-r.pid, 0) == 0 || errno != ESRCH);
    });
  }

  bool any_stream_open() const {
    return std::any_of(ranks_.begin(), ranks_.end(),
                       [](const Rank& r) { return r.out.fd >= 0 || r.err.fd >= 0; });
  }

  // Sleeps in poll() until output, a signal, or the next deadline, and handles what came.
  void wait_for_events(Clock::time_point now) {
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    std::vector<Stream*> streams{nullptr};
    for (auto& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.push_back(s);
      }
    }
    auto timeout = std::chrono::milliseconds(kTickMs);
    auto until = [&](Clock::time_point t) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - now) +
                  std::chrono::milliseconds(1);
      timeout = std::clamp(left, std::chrono::milliseconds(0), timeout);
    };
    if (stopping_ && !killed_) until(kill_deadline_);
    if (killed_) until(give_up_);
    if (drain_deadline_) until(*drain_deadline_);
    int n = ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
    if (n <= 0) return;  // timeout, or EINTR: the caller rechecks everything
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      Rank* owner = owner_of(streams[i]);
      pump(*streams[i], owner->prefix);
    }
    if (fds[0].revents) {
      unsigned char sigs[64];
      ssize_t got;
      while ((got = ::read(g_signal_pipe[0], sigs, sizeof sigs)) > 0) {
        for (ssize_t k = 0; k < got; ++k)
          if (sigs[k] == SIGINT || sigs[k] == SIGTERM || sigs[k] == SIGUSR1) on_launcher_signal(sigs[k]);
        // SIGCHLD only needed to wake us up; reap() runs at the top of the loop.
      }
    }
  }

  Rank* owner_of(const Stream* s) {
    for (auto& r : ranks_)
      if (&r.out == s || &r.err == s) return &r;
    return nullptr;  // unreachable: every polled stream belongs to a rank
  }

  const LaunchOptions& opts_;
  int port_;
  std::vector<Rank> ranks_;
  std::optional<int> result_;  // set by the first failure; 0 otherwise
  int forwarded_ = 0;          // the signal forwarded to the ranks (0: none)
  bool stopping_ = false;      // SIGTERM (or the forwarded signal) has been sent
  bool killed_ = false;        // SIGKILL has been sent, or there was nothing left to kill
  Clock::time_point kill_deadline_{};
  Clock::time_point give_up_{};  // after SIGKILL: stop waiting for the groups to empty
  std::optional<Clock::time_point> drain_deadline_;
};

void validate(const LaunchOptions& opts) {
  ME_CHECK(opts.nproc >= 1, "--nproc must be a positive integer, got ", opts.nproc);
  ME_CHECK(!opts.argv.empty() && !opts.argv[0].empty(),
           "no program to launch (the command after the launcher options is empty)");
  ME_CHECK(!opts.master_addr.empty(), "--master-addr must not be empty");
  ME_CHECK(opts.master_port >= 0 && opts.master_port <= 65535,
           "--master-port must be in 0..65535 (0 picks a free port), got ", opts.master_port);
  ME_CHECK(opts.grace_seconds >= 0, "the grace period must be >= 0 seconds, got ",
           opts.grace_seconds);
}

}  // namespace

std::string signal_name(int sig) {
  // POSIX has no portable signal -> name function (sigabbrev_np is glibc 2.32+), so the
  // signals a training job realistically dies of are listed here.
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    default: return cat("signal ", sig);
  }
}

int launch(const LaunchOptions& given) {
  validate(given);
  LaunchOptions opts = given;
  if (opts.job_token.empty()) {
    const char* inherited = std::getenv("ME_JOB_TOKEN");
    opts.job_token = inherited && *inherited ? inherited : random_token();
  }
  int port = opts.master_port != 0 ? opts.master_port : pick_free_port(opts.master_addr);
  // Our own buffered output must come out before the ranks', which we write with write(2).
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  SignalScope signals;
  AdoptOrphans adopt;
  Launcher launcher(opts, port);
  launcher.start_all();
  return launcher.run();
}

}  // namespace me::launch
