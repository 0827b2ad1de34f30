#include "engine/train/host_lead.h"

#include "engine/core/torch_compat.h"  // ME_TORCH_HAS_CUDA

#include <algorithm>
#include <chrono>
#include <vector>

#if ME_TORCH_HAS_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#endif

namespace me::train {

namespace {
using Clock = std::chrono::steady_clock;
}

struct HostLead::Impl {
#if ME_TORCH_HAS_CUDA
  struct Mark {
    cudaEvent_t event = nullptr;  // with timing, reused from step to step
    Clock::time_point at;
    int where = 0;  // as Window::least_at
  };
  std::vector<Mark> marks;  // marks[0]: the step's start
  size_t used = 0;          // marks recorded in the current step
  int forwards = 0, backwards = 0;  // in the current step
#endif
  std::vector<std::pair<double, int>> leads;  // {ms, where}, since the last take()

  ~Impl() {
#if ME_TORCH_HAS_CUDA
    for (auto& m : marks) cudaEventDestroy(m.event);
#endif
  }

  void record(int where) {
#if ME_TORCH_HAS_CUDA
    if (used == marks.size()) {
      Mark m;
      if (cudaEventCreate(&m.event) != cudaSuccess) {  // no figure rather than a failed step
        cudaGetLastError();
        return;
      }
      marks.push_back(m);
    }
    auto& m = marks[used];
    m.where = where;
    m.at = Clock::now();
    if (cudaEventRecord(m.event, c10::cuda::getCurrentCUDAStream().stream()) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    ++used;
#endif
  }

  // The step's first mark; marks left by a step that threw part-way are dropped.
  void begin_step() {
#if ME_TORCH_HAS_CUDA
    used = 0;
    forwards = backwards = 0;
#endif
    record(0);
  }

  void record_micro_batch(bool backward) {
#if ME_TORCH_HAS_CUDA
    record(backward ? -++backwards : ++forwards);
#else
    (void)backward;
#endif
  }

  // The marks of the step that ended (all done: the step read its gradient norm back; a mark
  // whose event is not, which should not happen, ends the reading rather than wait).
  void read_step() {
#if ME_TORCH_HAS_CUDA
    for (size_t i = 2; i < used; ++i) {  // 0: the step's start, 1: its first forward (see take)
      float gpu_ms = 0;
      if (cudaEventElapsedTime(&gpu_ms, marks[0].event, marks[i].event) != cudaSuccess) {
        cudaGetLastError();
        break;
      }
      const double host_ms = std::chrono::duration<double, std::milli>(marks[i].at - marks[0].at).count();
      leads.emplace_back(std::max(0.0, static_cast<double>(gpu_ms) - host_ms), marks[i].where);
    }
    used = 0;
#endif
  }
};

HostLead::HostLead(bool cuda) : impl_(cuda ? std::make_unique<Impl>() : nullptr) {}
HostLead::~HostLead() = default;

void HostLead::start_step() {
  if (impl_) impl_->begin_step();
}

void HostLead::end_step() {
  if (impl_) impl_->read_step();
}

void HostLead::mark(bool backward) {
  if (impl_) impl_->record_micro_batch(backward);
}

HostLead::Window HostLead::take() {
  Window w;
  if (!impl_ || impl_->leads.empty()) return w;
  auto& v = impl_->leads;
  std::sort(v.begin(), v.end());  // by lead; a tie goes to the earlier mark of the step
  w.least_ms = v.front().first;
  w.least_at = v.front().second;
  w.median_ms = v[v.size() / 2].first;
  v.clear();
  return w;
}

}  // namespace me::train
