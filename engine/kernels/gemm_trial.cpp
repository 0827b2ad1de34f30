#include "engine/kernels/gemm_trial.h"

#include "engine/core/graph_capture.h"

namespace me::kernels {

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

// Moves completed samples, oldest first, into the choice. cudaEventQuery's "not ready" is left as
// the thread's last error too: cleared here (as LibTorch's CUDAEvent::query does), or the next
// kernel launch check would take it for a failure.
void GemmTrial::read_completed() {
  while (!pending_.empty()) {
    const Sample s = pending_.front();
    const cudaError_t q = cudaEventQuery(s.end);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return;
    }
    float ms = CandidateChoice::kNever;
    if (q != cudaSuccess || cudaEventElapsedTime(&ms, s.start, s.end) != cudaSuccess) {
      (void)cudaGetLastError();
      ms = CandidateChoice::kNever;
    }
    choice_.record(s.candidate, ms);
    spare_.push_back(s.start), spare_.push_back(s.end);
    pending_.pop_front();
  }
}

GemmTrial::Turn GemmTrial::next(cudaStream_t stream) {
  Turn turn{choice_.chosen(), nullptr, nullptr};
  if (choice_.settled()) return turn;
  // Before any event call: none is allowed on a capturing thread.
  if (graph_capture_underway()) return turn;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess || capturing != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return turn;
  }
  read_completed();
  if (choice_.all_read()) {
    choice_.settle();
    for (auto e : spare_) cudaEventDestroy(e);
    spare_.clear();
    turn.candidate = choice_.chosen();
    return turn;
  }
  const int c = choice_.take_next();
  if (c < 0) return turn;  // every sample out: the first, untimed, until the last are read
  turn.start = event();
  turn.end = turn.start ? event() : nullptr;
  if (!turn.end) {  // no events to be had: this call untimed
    if (turn.start) spare_.push_back(turn.start);
    choice_.untake(c);
    return Turn{choice_.chosen(), nullptr, nullptr};
  }
  turn.candidate = c;
  return turn;
}

void GemmTrial::after(const Turn& turn, bool timed, bool ran) {
  if (!turn.start) return;
  if (!ran || !timed) {
    spare_.push_back(turn.start), spare_.push_back(turn.end);
    if (!ran) choice_.refuse(turn.candidate);
    else choice_.untake(turn.candidate);
    return;
  }
  pending_.push_back({turn.candidate, turn.start, turn.end});
}

}  // namespace me::kernels
