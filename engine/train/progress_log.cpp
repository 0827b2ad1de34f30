#include "engine/train/progress_log.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "engine/core/format.h"
#include "engine/core/log.h"
#include "engine/core/torch_compat.h"

namespace me::train {

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// "45s", "3m12s", "2h05m", "3d04h": a duration for people.
std::string duration_text(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char out[32];
  if (s < 60) std::snprintf(out, sizeof out, "%llds", static_cast<long long>(s));
  else if (s < 3600) std::snprintf(out, sizeof out, "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else if (s < 86400) std::snprintf(out, sizeof out, "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s % 3600 / 60));
  else std::snprintf(out, sizeof out, "%lldd%02lldh", static_cast<long long>(s / 86400), static_cast<long long>(s % 86400 / 3600));
  return out;
}

// ---- phases ---------------------------------------------------------------------------

void PhaseTimer::start() {
  if (!on_) return;
  if (cuda_) compat::cuda_synchronize();
  last_ = now_ms();
}

void PhaseTimer::mark(Phase phase) {
  if (!on_) return;
  if (cuda_) compat::cuda_synchronize();
  const double now = now_ms();
  total_[phase] += now - last_;
  last_ = now;
}

PhaseTimes PhaseTimer::take(int64_t steps) {
  PhaseTimes mean;
  for (int i = 0; i < kPhaseCount; ++i) mean.ms[i] = total_.ms[i] / static_cast<double>(steps);
  total_ = {};
  return mean;
}

// ---- the log window -------------------------------------------------------------------

void LogWindow::add(const torch::Tensor& loss, bool skipped, double ms, double waited_ms) {
  losses_.push_back(loss);
  skipped_.push_back(skipped);
  ms_ += ms;
  waited_ms_ += waited_ms;
}

double LogWindow::close(std::vector<double>& all) {
  const auto values = torch::cat(losses_).to(torch::kCPU, torch::kDouble);
  double sum = 0;
  int64_t counted = 0;
  for (size_t k = 0; k < losses_.size(); ++k) {
    const double loss = values[static_cast<int64_t>(k)].item<double>();
    all.push_back(loss);
    if (!skipped_[k]) {
      sum += loss;
      ++counted;
    }
  }
  steps_closed_ = static_cast<int64_t>(losses_.size());
  ms_per_step_ = ms_ / static_cast<double>(losses_.size());
  closed_waited_ms_ = waited_ms_;
  losses_.clear();
  skipped_.clear();
  ms_ = waited_ms_ = 0;
  return counted ? sum / static_cast<double>(counted) : all.back();
}

namespace {
// " | WHAT over ranks (min/median/max): a/b/c (min: rank r)", or "" where not measured
// (bench/speed/tp_width.sh's spread_over_ranks reads this form).
std::string spread_text(const char* what, const RankSpread& s) {
  if (s.rank < 0) return "";
  char line[256];
  std::snprintf(line, sizeof line, " | %s over ranks (min/median/max): %.2f/%.2f/%.2f (min: rank %d)", what, s.min,
                s.median, s.max, s.rank);
  return line;
}
}  // namespace

void log_progress_line(const LogRecord& r) {
  static const bool terminal = isatty(STDOUT_FILENO) == 1;
  const std::string eta = r.eta_s >= 0 ? duration_text(r.eta_s) : "";
  char line[768];
  std::snprintf(line, sizeof line, " iteration %8lld/%8lld%s | consumed samples: %10lld | elapsed time per iteration (ms): %.1f | "
                "learning rate: %.3E | global batch size: %5lld | lm loss: %.6E | grad norm: %.3f | "
                "number of skipped iterations: %3lld | number of nan iterations: %3lld | tokens/s: %.0f | "
                "TFLOP/s/GPU: %.2f",
                static_cast<long long>(r.iteration), static_cast<long long>(r.iters),
                terminal && !eta.empty() ? (" (ETA " + eta + ")").c_str() : "", static_cast<long long>(r.consumed_samples),
                r.ms_per_iter, r.lr, static_cast<long long>(r.global_batch), r.loss, r.grad_norm,
                static_cast<long long>(r.skipped), static_cast<long long>(r.nan), r.tokens_per_s, r.tflops_per_gpu);
  std::string text = line;
  if (r.mfu > 0) {
    std::snprintf(line, sizeof line, " | MFU: %.1f%%", 100.0 * r.mfu);
    text += line;
  }
  if (r.loss_scale > 0) {
    std::snprintf(line, sizeof line, " | loss scale: %.1f", r.loss_scale);
    text += line;
  }
  if (!terminal && !eta.empty()) text += " | ETA: " + eta;
  if (r.slowest_rank >= 0) {
    std::snprintf(line, sizeof line, " | own step ms over ranks (min/median/max): %.1f/%.1f/%.1f (max: rank %d)",
                  r.rank_ms_min, r.rank_ms_median, r.rank_ms_max, r.slowest_rank);
    text += line;
  }
  text += spread_text("GPU ms waiting at TP barriers", r.barrier_ms);
  text += spread_text("host ms waiting for its GPU", r.host_wait_ms);
  if (r.host_lead_ms.rank >= 0) {
    text += spread_text("host ms ahead of its GPU at micro-batches (each rank's median)", r.host_lead_ms);
    std::snprintf(line, sizeof line, ", least of all %.2f", r.host_lead_least_ms);
    text += line;
    if (r.host_lead_least_at != 0) {  // where: which rank, and before which micro-batch's work
      std::snprintf(line, sizeof line, " (rank %d, micro-batch %d's %s)", r.host_lead_least_rank,
                    std::abs(r.host_lead_least_at), r.host_lead_least_at > 0 ? "forward" : "backward");
      text += line;
    }
  }
  log::info(text);
  if (r.phases.any()) {
    std::string phases = " phases (ms per iteration, synchronised):";
    for (int i = 0; i < kPhaseCount; ++i)
      phases += cat(i ? " |" : "", " ", kPhaseNames[i], " ", std::round(r.phases.ms[i] * 10) / 10);
    log::info(phases);
  }
  if (r.val_loss >= 0) {
    std::snprintf(line, sizeof line, " validation loss at iteration %lld | lm loss: %.6E | lm loss PPL: %.3f",
                  static_cast<long long>(r.iteration), r.val_loss, std::exp(r.val_loss));
    log::info(line);
  }
}

}  // namespace me::train
