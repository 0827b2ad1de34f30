// The progress line and what feeds it: the steps of a log window (their losses kept on the device
// until the line is written), the phase timer of train.profile_phases, and Megatron's line itself.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "engine/train/log_record.h"

namespace me::train {

// The steps between two progress lines. Their losses stay on the device until the line is
// written: reading each one would make the host wait for every step's end before queueing the
// next.
class LogWindow {
 public:
  // A step: its loss (on the device), whether it was skipped, its time and the part of it
  // spent waiting for other ranks.
  void add(const torch::Tensor& loss, bool skipped, double ms, double waited_ms);
  // Reads the window's losses back, appends them to `all`, and returns the mean loss of the
  // steps that were not skipped (the last loss when all were); empties the window.
  double close(std::vector<double>& all);
  double ms_per_step() const { return ms_per_step_; }  // of the window last closed
  double waited_ms() const { return closed_waited_ms_; }  // its total time waiting for ranks
  int64_t steps_closed() const { return steps_closed_; }

 private:
  std::vector<torch::Tensor> losses_;
  std::vector<bool> skipped_;
  double ms_ = 0, ms_per_step_ = 0, waited_ms_ = 0, closed_waited_ms_ = 0;
  int64_t steps_closed_ = 0;
};

// Times the phases of a step (train.profile_phases): mark(p) charges the time since the last
// mark to phase p, synchronising the GPU first so the phases do not overlap.
class PhaseTimer {
 public:
  PhaseTimer(bool on, bool cuda) : on_(on), cuda_(cuda) {}
  void start();
  void mark(Phase phase);
  PhaseTimes take(int64_t steps);  // mean ms per step since the last take, and restart

 private:
  bool on_, cuda_;
  PhaseTimes total_;
  double last_ = 0;
};

// Megatron's progress line, then what it lacks: MFU, the loss scale, the time left (on a
// terminal beside the iteration, in a log file as a field of its own) and, with several ranks,
// each rank's own step time; the phases and the validation loss on lines of their own.
void log_progress_line(const LogRecord& r);

// "45s", "3m12s", "2h05m", "3d04h": a duration for people.
std::string duration_text(double seconds);

double now_ms();  // a steady clock, in milliseconds

}  // namespace me::train
