// SIGTERM and SIGUSR1 ask a training run to stop at the next step boundary (saving a checkpoint
// first when there is a checkpoint.dir): Slurm sends them before the time limit
// (--signal=USR1@300), on preemption and on scancel. A first SIGINT (Ctrl-C) does the same; a
// second one kills the process at once. While a StopSignals is alive their handlers only
// record the signal; the previous handlers come back when it goes.
#pragma once
#include <csignal>

namespace me {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The last stop signal received since the handlers were installed (0: none).
  static int received();

 private:
  struct sigaction old_term_ {}, old_usr1_ {}, old_int_ {};
};

}  // namespace me
