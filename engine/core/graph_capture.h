// Whether this process is capturing a CUDA graph (train.cuda_graphs, model/block_graphs.h).
// What a capture records is replayed without the host: code that decides on the host what the
// GPU does next (a signal counted by the host, a hook that starts a reduction, a cached tensor
// filled once) asks here and takes its graph-safe path. Process-wide, not per thread: autograd
// runs a captured backward on its own thread. Torch-free.
#pragma once
#include <atomic>

namespace me {

namespace detail {
inline std::atomic<int>& graph_captures() {
  static std::atomic<int> n{0};
  return n;
}
}  // namespace detail

inline bool graph_capture_underway() { return detail::graph_captures().load(std::memory_order_relaxed) > 0; }

// Marks a capture for as long as it lives.
class GraphCaptureScope {
 public:
  GraphCaptureScope() { ++detail::graph_captures(); }
  ~GraphCaptureScope() { --detail::graph_captures(); }
  GraphCaptureScope(const GraphCaptureScope&) = delete;
  GraphCaptureScope& operator=(const GraphCaptureScope&) = delete;
};

}  // namespace me
