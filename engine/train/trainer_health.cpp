// What the trainer watches besides the loss: steps whose gradient is not finite (which
// parameter, on which rank; train.nan_policy), ranks slower than the others (stragglers), the
// time left, and the stop control every rank agrees on at each step. Also the test facilities that provoke them (documented in docs/testing.md):
//   ME_TEST_NAN_AT=K:R     at iteration K, the gradient of rank R's last parameter becomes NaN
//                          (on every rank holding the same model piece as R, so that data-
//                          parallel ranks agree)
//   ME_TEST_SLOW_RANK=R:MS rank R sleeps MS milliseconds at the start of every step
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "engine/core/format.h"
#include "engine/core/error.h"
#include "engine/core/exit_status.h"
#include "engine/core/log.h"
#include "engine/core/stop_signals.h"
#include "engine/train/trainer.h"

namespace me::train {

namespace {

// "A:B" -> {A, B}; {-1, -1} when unset or malformed.
std::pair<int64_t, int64_t> env_pair(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return {-1, -1};
  const std::string s = v;
  const auto colon = s.find(':');
  if (colon == std::string::npos) return {-1, -1};
  try {
    return {std::stoll(s.substr(0, colon)), std::stoll(s.substr(colon + 1))};
  } catch (const std::exception&) {
    fail(name, "='", s, "': expected two integers A:B");
  }
}

}  // namespace

// ---- stop control ----------------------------------------------------------------------------

// The per-step agreement of every rank: the largest stop signal any rank received, and whether
// some rank is still writing its part of a save; one small all-reduce issued before the
// optimizer step and read after it, so that every rank stops or commits at the same step.
void Trainer::start_control() {
  const int sig = StopSignals::received();
  const bool writing = saver_ && saver_->writing();
  if (!comm_ || comm_->world_size() == 1) {
    agreed_ = {sig, writing};
    return;
  }
  control_ = torch::tensor({sig, writing ? 1 : 0}, torch::kInt).to(device_);
  comm_->world()->all_reduce(control_, comm::ReduceOp::max);
}

void Trainer::read_control() {
  if (!control_.defined()) return;
  const auto c = control_.to(torch::kCPU);
  agreed_ = {c[0].item<int>(), c[1].item<int>() != 0};
  control_ = torch::Tensor();
}

// ---- test faults -----------------------------------------------------------------------------

int Trainer::rank() const { return comm_ ? comm_->rank() : 0; }

void Trainer::test_faults_before_step() const {
  static const auto slow = env_pair("ME_TEST_SLOW_RANK");
  if (slow.first == rank() && slow.second > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow.second));
}

void Trainer::test_faults_after_backward() {
  static const auto at = env_pair("ME_TEST_NAN_AT");
  if (at.first != iteration_ + 1 || params_.empty()) return;
  // Every rank holding the same piece of the model as rank R (its data-parallel peers too).
  if (groups_) {
    auto mine = groups_->grid.coords(rank()), theirs = groups_->grid.coords(static_cast<int>(at.second));
    mine.dp = theirs.dp = 0;
    if (!(mine == theirs)) return;
  } else if (at.second != 0) {
    return;
  }
  for (auto& piece : grads_->reduced_views(params_.size() - 1)) piece.fill_(std::nan(""));
}

// All ranks, after a step whose gradient norm was not finite: names the first parameter (in
// model order) whose gradient is not finite, and the ranks that hold one.
void Trainer::report_non_finite(double norm) {
  std::string mine;
  const auto named = model_->named_parameters();
  for (size_t i = 0; i < named.size() && mine.empty(); ++i)
    for (const auto& piece : grads_->reduced_views(i))
      if (!torch::isfinite(piece).all().item<bool>()) {
        mine = model_->global_name(named[i].key());
        break;
      }
  const auto all = comm_ ? comm_->all_gather_object(mine) : std::vector<std::string>{mine};
  if (!is_logging_rank()) return;
  std::string first, where;
  int first_rank = -1;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    if (first_rank < 0) first = all[r], first_rank = static_cast<int>(r);
    where += cat(where.empty() ? "" : ", ", r);
  }
  const std::string host = comm_ && first_rank >= 0 ? cat(" (", comm_->hosts()[static_cast<size_t>(first_rank)], ")") : "";
  log::warn("iteration ", iteration_, ": the gradient norm is ", norm, "; the first non-finite gradient is ",
            first.empty() ? std::string("in none of the parameters (the loss?)") : cat(first, " on rank ", first_rank, host),
            where.empty() ? "" : cat(" (non-finite gradients on rank", all.size() > 1 ? "s " : " ", where, ")"),
            "; the update was skipped (", consecutive_nan_, " in a row, train.nan_policy = ", spec_.train.nan_policy, ")");
}

// The optimizer skipped the update when the gradient norm was not finite (it would poison the
// weights and every later step): counted, reported, and the run stopped after
// train.max_consecutive_nan in a row under nan_policy = stop. fp16's overflows are expected now
// and then: the loss scaler backs off, no warning. Returns whether the update was applied.
bool Trainer::accept_update(double grad_norm) {
  const bool finite = std::isfinite(grad_norm);
  if (scaler_) scaler_->update(!finite);
  if (finite) {
    consecutive_nan_ = 0;
    return true;
  }
  ++skipped_;
  if (std::isnan(grad_norm)) ++nan_;
  if (!scaler_) after_non_finite(grad_norm);
  return false;
}

// The step after a non-finite gradient: counts it and decides whether the run stops
// (nan_policy = stop, max_consecutive_nan in a row).
void Trainer::after_non_finite(double norm) {
  ++consecutive_nan_;
  report_non_finite(norm);
  const auto& t = spec_.train;
  if (t.nan_policy == "stop" && consecutive_nan_ >= t.max_consecutive_nan) stop_non_finite_ = true;
}

namespace {

// The median of the first n of sorted times (the mean of the middle two for an even n).
double median_of(const std::vector<std::pair<double, int>>& sorted, size_t n) {
  return n % 2 ? sorted[n / 2].first : (sorted[n / 2 - 1].first + sorted[n / 2].first) / 2;
}

// Min, median and max of per-rank values, and the ranks at the ends; sorts `values` (by value).
struct Spread {
  double min, median, max;
  int min_rank, max_rank;
};
Spread spread_of(std::vector<std::pair<double, int>>& values) {
  std::sort(values.begin(), values.end());
  return {values.front().first, values[values.size() / 2].first, values.back().first, values.front().second,
          values.back().second};
}

// The spread with the rank that has the least named.
RankSpread least_named(const Spread& s) { return {s.min, s.median, s.max, s.min_rank}; }

}  // namespace

// Each rank's own step time over the window (its step less the time it waited for the other
// ranks), gathered every log interval; the slowest is named when above straggler_factor x the
// median of the OTHER ranks. (Against the median of all ranks, a straggler among two is its
// own median and is never found.)
// With barrier_ms >= 0 (this rank's GPU time per step waiting at the copy-engine barriers), the
// same gather gives their spread and the rank that waits least (bench/speed/tp_width.sh reads it:
// a profile's host overhead changes which rank paces, this cannot). On GPUs it also gives the
// host's time blocked at the gradient norm (host_wait_ms, the window's): the rank that waits
// least there is the one whose host the others wait for, when that is near 0; and each host's
// lead over its GPU at its micro-batches' starts (HostLead: the median and the least over the
// window), which says where in the step a host falls behind, not only at its end.
void Trainer::measure_stragglers(LogRecord& rec, double window_ms, double window_waited_ms, int64_t steps,
                                 double host_wait_ms, double barrier_ms, HostLead::Window lead) {
  if (!comm_ || comm_->world_size() == 1) return;
  const double own = std::max(0.0, (window_ms - window_waited_ms) / static_cast<double>(steps));
  const double host_wait = host_wait_ms / static_cast<double>(steps);
  const auto all =
      comm_->all_gather_object(cat(own, " ", barrier_ms, " ", host_wait, " ", lead.median_ms, " ", lead.least_ms, " ", lead.least_at));
  std::vector<std::pair<double, int>> by_time, by_wait, by_host_wait, by_lead;
  double least_lead = -1;
  int least_lead_rank = -1, least_lead_at = 0;
  for (size_t r = 0; r < all.size(); ++r) {
    std::istringstream in(all[r]);
    double t = 0, w = 0, h = 0, lm = 0, ll = 0;
    int at = 0;
    ME_CHECK(static_cast<bool>(in >> t >> w >> h >> lm >> ll >> at), "rank ", r, "'s step times could not be read: '", all[r],
             "'");
    by_time.emplace_back(t, static_cast<int>(r));
    by_wait.emplace_back(w, static_cast<int>(r));
    by_host_wait.emplace_back(h, static_cast<int>(r));
    by_lead.emplace_back(lm, static_cast<int>(r));
    if (ll >= 0 && (least_lead < 0 || ll < least_lead)) least_lead = ll, least_lead_rank = static_cast<int>(r), least_lead_at = at;
  }
  if (const auto w = spread_of(by_wait); w.min >= 0) rec.barrier_ms = least_named(w);  // every rank measured
  // On the CPU the norm is read back from a finished host computation.
  if (device_.is_cuda()) rec.host_wait_ms = least_named(spread_of(by_host_wait));
  if (const auto l = spread_of(by_lead); l.min >= 0) {  // every rank read its marks
    rec.host_lead_ms = least_named(l);
    rec.host_lead_least_ms = least_lead;
    rec.host_lead_least_rank = least_lead_rank, rec.host_lead_least_at = least_lead_at;
  }
  const auto t = spread_of(by_time);  // by_time sorted, for the median of the others below
  rec.rank_ms_min = t.min, rec.rank_ms_median = t.median, rec.rank_ms_max = t.max;
  rec.slowest_rank = t.max_rank;
  const double factor = spec_.train.straggler_factor;
  const double others = median_of(by_time, by_time.size() - 1);  // all but the slowest
  if (factor > 0 && is_logging_rank() && rec.rank_ms_max > factor * others && others > 0)
    log::warn("straggler: rank ", rec.slowest_rank, " (", comm_->hosts()[static_cast<size_t>(rec.slowest_rank)],
              ") takes ", human::number(rec.rank_ms_max), " ms of its own per step, ",
              human::number(rec.rank_ms_max / others), "x the median of the other ranks (", human::number(others),
              " ms; train.straggler_factor = ", factor, "): a slow GPU, host or data read on that node");
}

// Seconds to the end of the schedule (its iterations) at the window's rate.
double Trainer::eta_seconds(double ms_per_iter) const {
  return static_cast<double>(plan_.iters - iteration_) * ms_per_iter / 1000.0;
}

}  // namespace me::train
