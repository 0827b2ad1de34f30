#include "engine/kernels/gemm_trial.h"

#include <algorithm>
#include <limits>

namespace me::kernels {

namespace {
constexpr float kNever = std::numeric_limits<float>::infinity();  // a candidate that did not run
}

GemmTrial::GemmTrial(int candidates) : launched_(size_t(std::max(candidates, 1)), 0), ms_(launched_.size()) {}

GemmTrial::~GemmTrial() {
  for (const auto& s : pending_) cudaEventDestroy(s.start), cudaEventDestroy(s.end);
  for (auto e : spare_) cudaEventDestroy(e);
}

cudaEvent_t GemmTrial::event() {
  if (!spare_.empty()) {
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  if (cudaEventCreate(&e) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return e;
}

// Moves completed samples, oldest first, into ms_. cudaEventQuery's "not ready" is left as the
// thread's last error too: cleared here (as LibTorch's CUDAEvent::query does), or the next kernel
// launch check would take it for a failure.
void GemmTrial::read_completed() {
  while (!pending_.empty()) {
    const Sample s = pending_.front();
    const cudaError_t q = cudaEventQuery(s.end);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return;
    }
    float ms = kNever;
    if (q != cudaSuccess || cudaEventElapsedTime(&ms, s.start, s.end) != cudaSuccess) {
      (void)cudaGetLastError();
      ms = kNever;
    }
    ms_[size_t(s.candidate)].push_back(ms);
    spare_.push_back(s.start), spare_.push_back(s.end);
    pending_.pop_front();
  }
}

float GemmTrial::median(int candidate) const {
  auto v = ms_[size_t(candidate)];
  if (v.empty()) return kNever;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

void GemmTrial::settle() {
  int best = 0;
  for (int c = 1; c < candidates(); ++c)
    if (median(c) < median(best)) best = c;
  // The heuristic's choice unless another is clearly faster: near a tie the medians would flip.
  chosen_ = median(best) < 0.98f * median(0) ? best : 0;
  settled_ = true;
  for (auto e : spare_) cudaEventDestroy(e);
  spare_.clear();
}

GemmTrial::Turn GemmTrial::next(cudaStream_t stream) {
  Turn turn{chosen_, nullptr, nullptr};
  if (settled_) return turn;
  read_completed();
  bool all_read = pending_.empty();
  for (int c = 0; c < candidates() && all_read; ++c) all_read = int(ms_[size_t(c)].size()) >= kSamples;
  if (all_read) {
    settle();
    turn.candidate = chosen_;
    return turn;
  }
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess || capturing != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return turn;
  }
  // The next candidate, round robin, with samples still to take; none: the first, untimed, until
  // the last samples are read.
  for (int i = 0; i < candidates(); ++i) {
    const int c = (next_ + i) % candidates();
    if (launched_[size_t(c)] >= kSamples) continue;
    turn.start = event();
    turn.end = turn.start ? event() : nullptr;
    if (!turn.end) {  // no events to be had: untimed
      if (turn.start) spare_.push_back(turn.start);
      turn.start = nullptr;
      return turn;
    }
    turn.candidate = c;
    next_ = (c + 1) % candidates();
    return turn;
  }
  return turn;
}

void GemmTrial::after(const Turn& turn, bool ran) {
  if (!turn.start) return;
  if (!ran) {  // refused: recorded as never running, so never chosen
    spare_.push_back(turn.start), spare_.push_back(turn.end);
    launched_[size_t(turn.candidate)] = kSamples;
    ms_[size_t(turn.candidate)].assign(kSamples, kNever);
    return;
  }
  pending_.push_back({turn.candidate, turn.start, turn.end});
  ++launched_[size_t(turn.candidate)];
}

}  // namespace me::kernels
