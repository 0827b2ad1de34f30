#include "engine/core/stop_signals.h"

namespace me {
namespace {

volatile std::sig_atomic_t g_received = 0;
volatile std::sig_atomic_t g_interrupts = 0;

void on_stop_signal(int sig) {
  // A second Ctrl-C: the user will not wait for the step and the save; die of SIGINT at once.
  if (sig == SIGINT && g_interrupts++ > 0) {
    ::signal(SIGINT, SIG_DFL);
    ::raise(SIGINT);
    return;
  }
  g_received = sig;
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  g_interrupts = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &sa, &old_term_);
  ::sigaction(SIGUSR1, &sa, &old_usr1_);
  ::sigaction(SIGINT, &sa, &old_int_);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGTERM, &old_term_, nullptr);
  ::sigaction(SIGUSR1, &old_usr1_, nullptr);
  ::sigaction(SIGINT, &old_int_, nullptr);
}

int StopSignals::received() { return g_received; }

}  // namespace me
