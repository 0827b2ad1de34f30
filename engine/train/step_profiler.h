// Where a step's device time goes, kernel by kernel: LibTorch's Kineto profiler around a few
// training steps (train.profile_at, train.profile_steps). Writes the Chrome trace (open it in
// Perfetto or chrome://tracing) and summarises the kernels per step: by kind (matmul,
// attention, communication, engine kernels, other LibTorch kernels) and the heaviest ones,
// with the share of the step the GPU was idle. Unlike train.profile_phases it does not
// synchronise inside the step, so the overlap it shows is the real one.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace me::train {

class StepProfiler {
 public:
  // `trace`: the Chrome trace's path ("" writes none); `rank` is added to it for ranks > 0.
  StepProfiler(int64_t at, int64_t steps, std::string trace, bool cuda, int rank);
  ~StepProfiler();

  // Called around every step: starts before step `at`, stops after `at + steps - 1`.
  void before_step(int64_t iteration);
  // Returns the summary when the profile just ended ("" otherwise). `wall_ms`: those steps'
  // total host time, for the idle share.
  std::string after_step(int64_t iteration, double step_ms);

  bool active() const { return active_; }

 private:
  std::string summarise();

  int64_t at_, steps_;
  std::string trace_;
  bool cuda_, active_ = false;
  double wall_ms_ = 0;
};

}  // namespace me::train
