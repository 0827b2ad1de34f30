// Which of a GEMM shape's candidate algorithms to keep, from times taken in the step (gemm_trial.h
// takes them with CUDA events; this is the bookkeeping and the rule, plain C++ so that CPU tests
// check it): candidates are taken in turn, round robin, until each has kSamples times; then the
// least median wins, unless the first candidate (cuBLASLt's heuristic's choice) is within 2% of
// it, as near a tie the medians would flip from run to run. A candidate cuBLASLt refuses counts as
// never finishing.
#pragma once
#include <algorithm>
#include <limits>
#include <vector>

namespace me::kernels {

class CandidateChoice {
 public:
  static constexpr int kSamples = 3;
  static constexpr float kNever = std::numeric_limits<float>::infinity();

  explicit CandidateChoice(int candidates)
      : launched_(size_t(std::max(candidates, 1)), 0), ms_(launched_.size()) {}

  int candidates() const { return int(launched_.size()); }

  // The candidate the next timed call takes (round robin over those with samples still to take),
  // or -1 when every sample is out: calls take chosen() meanwhile. Marks it taken.
  int take_next() {
    for (int i = 0; i < candidates(); ++i) {
      const int c = (next_ + i) % candidates();
      if (launched_[size_t(c)] >= kSamples) continue;
      ++launched_[size_t(c)];
      next_ = (c + 1) % candidates();
      return c;
    }
    return -1;
  }
  // A taken call that did not happen after all (no events to time it with).
  void untake(int candidate) { --launched_[size_t(candidate)]; }
  // cuBLASLt refused the candidate: never taken again, never chosen.
  void refuse(int candidate) {
    launched_[size_t(candidate)] = kSamples;
    ms_[size_t(candidate)].assign(kSamples, kNever);
  }
  // A time read back for a taken call (kNever where it could not be read).
  void record(int candidate, float ms) { ms_[size_t(candidate)].push_back(ms); }

  // Every candidate's samples read: settle() may choose.
  bool all_read() const {
    for (const auto& v : ms_)
      if (int(v.size()) < kSamples) return false;
    return true;
  }
  void settle() {
    int best = 0;
    for (int c = 1; c < candidates(); ++c)
      if (median(c) < median(best)) best = c;
    chosen_ = median(best) < 0.98f * median(0) ? best : 0;
    settled_ = true;
  }
  bool settled() const { return settled_; }
  int chosen() const { return chosen_; }
  float median(int candidate) const {
    auto v = ms_[size_t(candidate)];
    if (v.empty()) return kNever;
    std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
    return v[v.size() / 2];
  }

 private:
  std::vector<int> launched_;           // samples taken, per candidate
  std::vector<std::vector<float>> ms_;  // samples read, per candidate
  int next_ = 0;                        // where the round robin goes on
  int chosen_ = 0;
  bool settled_ = false;
};

}  // namespace me::kernels
