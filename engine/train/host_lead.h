// How far a host runs ahead of its GPU, measured on unprofiled steps: at the start of each step
// (its GPU idle since the last step's synchronisation) and before each micro-batch's forward and
// backward is queued, an event is recorded and the host's clock read; once the step's work is
// done, each mark's lead is the GPU's time from the step's event to the mark's, less the host's.
// A lead near 0 means the GPU reached that point as soon as the host queued it: it had run out
// of work, and the host set the pace there. The profiler answers the same question but slows
// every host, which changes the answer (bench/RESULTS.md, sessions 19-31).
#pragma once
#include <memory>

namespace me::train {

class HostLead {
 public:
  explicit HostLead(bool cuda);  // nothing is measured on the CPU
  ~HostLead();
  HostLead(const HostLead&) = delete;
  HostLead& operator=(const HostLead&) = delete;

  // The step's first event (marks left by a step that threw part-way are dropped).
  void start_step();
  // A micro-batch's forward (backward false) or backward is about to be queued on the current
  // stream: the step's k-th of its kind is micro-batch k's (backwards run oldest first).
  void mark(bool backward);
  // After the step has read its gradient norm back (its marks are all done): their leads.
  void end_step();

  struct Window {
    double median_ms = -1, least_ms = -1;  // over the marks since the last take(); -1: none
    int least_at = 0;  // where the least was: +k micro-batch k's forward, -k its backward; 0: none
  };
  // The leads read since the last take() (each step's first mark left out: its GPU was idle
  // when the step began, so its lead is 0 whatever the host does).
  Window take();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace me::train
