// The local multi-process launcher: `megaengine --nproc N ...` starts N ranks of a program on
// this machine, the way torchrun does for one node. Pure POSIX (fork, pipes, poll, process
// groups), so it works before LibTorch is loaded and needs nothing but the C library.
#pragma once
#include <string>
#include <vector>

namespace me::launch {

struct LaunchOptions {
  int nproc = 1;                         // processes to start (>= 1)
  std::vector<std::string> argv;         // program and its arguments, run once per rank
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                   // 0: pick a free TCP port on master_addr
  double grace_seconds = 5.0;            // after SIGTERM, wait this long before SIGKILL
  // After SIGTERM or SIGUSR1 received by the launcher and forwarded: time for the ranks to save
  // a checkpoint and stop by themselves before SIGKILL.
  double save_grace_seconds = 600.0;
  bool prefix_output = true;             // "[rank 3] " before every line of a child's output
  // The job token the ranks present to their rendezvous store (ME_JOB_TOKEN, job_token.h).
  // Empty: ME_JOB_TOKEN from our environment when set, else a fresh random one per launch.
  std::string job_token;
};

// Starts the ranks, relays their output and returns the exit code megaengine should exit with.
//
// Each rank gets the parent's environment plus RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, ME_JOB_TOKEN and ME_LAUNCHED=1, runs in its own process group (so stopping a rank
// stops everything it started), reads stdin from /dev/null, and has its stdout/stderr relayed
// line by line to ours, prefixed "[rank R] ".
//
// Returns 0 when every rank exited 0. When a rank fails, prints one line naming it to stderr
// ("megaengine: rank 2 exited with status 3; stopping the other 3 ranks"), sends SIGTERM to the
// others (and SIGCONT, so that a stopped rank acts on it), SIGKILL after grace_seconds, reaps
// them all and returns 1. SIGINT, SIGTERM and SIGUSR1 received by the launcher are forwarded to
// every rank (SIGTERM and SIGUSR1 with save_grace_seconds, for a checkpoint; a second signal kills
// at once); the result is the ranks' common exit status (75 after a saved stop, 0 if they
// finished), else 128 + the signal. Throws me::Error on invalid options or when the ranks cannot
// be started (after stopping any already started). Not reentrant: one launch at a time.
int launch(const LaunchOptions& opts);

// "SIGKILL" for 9, "signal 77" for a number without a well-known name.
std::string signal_name(int sig);

}  // namespace me::launch
