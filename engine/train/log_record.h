// What one progress line says, as data: the trainer fills it at every log interval, prints it
// (Megatron's line) and hands it to Lua hooks (`on_log`) and the metrics writers.
#pragma once
#include <array>
#include <cstdint>

namespace me::train {

// The phases of a training step, as train.profile_phases times them.
enum class Phase { data, forward, backward, reduce, optimizer };
inline constexpr int kPhaseCount = 5;
inline constexpr std::array<const char*, kPhaseCount> kPhaseNames = {"data", "forward", "backward", "reduce",
                                                                     "optimizer"};
inline const char* phase_name(Phase p) { return kPhaseNames[static_cast<int>(p)]; }

// Milliseconds per phase, indexed by Phase.
struct PhaseTimes {
  std::array<double, kPhaseCount> ms{};
  double& operator[](Phase p) { return ms[static_cast<int>(p)]; }
  double operator[](Phase p) const { return ms[static_cast<int>(p)]; }
  bool any() const { return ms[static_cast<int>(Phase::forward)] > 0; }
};

// A figure measured on every rank: min / median / max over ranks, and the rank that has the least
// (the one the others wait for, in the figures below). rank < 0: not measured.
struct RankSpread {
  double min = 0, median = 0, max = 0;
  int rank = -1;
};

struct LogRecord {
  int64_t iteration = 0, iters = 0, consumed_samples = 0, global_batch = 0, skipped = 0, nan = 0;
  double lr = 0, loss = 0, grad_norm = 0, ms_per_iter = 0, tokens_per_s = 0, tflops_per_gpu = 0, mfu = 0;
  double val_loss = -1;   // < 0 when no evaluation ran at this iteration
  double loss_scale = 0;  // fp16 only
  PhaseTimes phases;      // train.profile_phases: mean ms per iteration over the log window
  double eta_s = -1;      // seconds to the end of the schedule at this window's rate (< 0: unknown)
  // Several ranks: each rank's own step time (its step less the time it waited for the
  // others), min / median / max over ranks, and the rank with the max.
  double rank_ms_min = 0, rank_ms_median = 0, rank_ms_max = 0;
  int slowest_rank = -1;
  // Copy-engine tensor parallelism: each rank's GPU time per step in the reduce-scatters'
  // barriers on its compute stream (waiting for the other ranks); its rank waits least.
  RankSpread barrier_ms;
  // Several ranks on GPUs: each rank's host time per step blocked reading the gradient norm back
  // (waiting for its GPU, and through the norm's all-reduce for the others). Near 0 for the rank
  // that waits least: that host launches its work no sooner than its GPU runs it, and sets the pace.
  RankSpread host_wait_ms;
  // Several ranks on GPUs: each host's lead over its GPU where it queues a micro-batch's forward
  // or backward (HostLead), the median over the window's marks; and the least single lead of any
  // rank, that rank, and where in the step it was (HostLead::Window::least_at: +k micro-batch k's
  // forward, -k its backward). A median near 0: that host is behind its GPU through the step.
  RankSpread host_lead_ms;
  double host_lead_least_ms = 0;
  int host_lead_least_rank = -1, host_lead_least_at = 0;
};

}  // namespace me::train
