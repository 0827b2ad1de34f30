// cuBLASLt's candidate algorithms for one GEMM shape tried in the training step itself
// (ME_GEMM_AUTOTUNE=1, cublaslt_gemm.cpp): the shape's calls take the candidates in turn, each
// call between two CUDA events on its stream, and the events are read as they complete, without
// waiting for the GPU; which candidate is kept is candidate_choice.h's rule (the least median of
// three, the heuristic's first unless another is 2% faster). Timed where they run, among the
// step's other kernels: the thirty-fifth session's timing of each candidate alone, before its
// first call, chose kernels 5% faster alone that made the LLaMA-2-70B width's layer 0.7% slower
// in the step. Every candidate computes the same product (to its rounding), so the calls that try
// them are the step's own. Nothing of it while a CUDA graph is being captured anywhere in the
// process (train.cuda_graphs): querying an event on the capturing thread would end the capture,
// and a graph would replay the events as they were. Those calls take the current choice, and a
// graphed GEMM keeps it (a shape whose trial has not settled by the capture, in the second step,
// keeps the heuristic's first). Host only, no LibTorch.
#pragma once
#include <cuda_runtime.h>

#include <deque>
#include <vector>

#include "engine/kernels/candidate_choice.h"

namespace me::kernels {

class GemmTrial {
 public:
  explicit GemmTrial(int candidates) : choice_(candidates) {}
  ~GemmTrial();
  GemmTrial(const GemmTrial&) = delete;
  GemmTrial& operator=(const GemmTrial&) = delete;

  // What the next call takes: a candidate, and the events to record before and after it (both
  // null when this call is not timed: every candidate's samples are out, or the stream captures).
  struct Turn {
    int candidate = 0;
    cudaEvent_t start = nullptr, end = nullptr;
  };
  Turn next(cudaStream_t stream);
  // After the call: `timed` false where its events could not be recorded (the call counts for
  // nothing), `ran` false where cuBLASLt refused the candidate (never tried again).
  void after(const Turn& turn, bool timed, bool ran);
  const CandidateChoice& choice() const { return choice_; }

 private:
  struct Sample {
    int candidate;
    cudaEvent_t start, end;
  };
  void read_completed();
  cudaEvent_t event();

  CandidateChoice choice_;
  std::deque<Sample> pending_;      // recorded, not yet read, oldest first
  std::vector<cudaEvent_t> spare_;  // events of read samples, for reuse
};

}  // namespace me::kernels
