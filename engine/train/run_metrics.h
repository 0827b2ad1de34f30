// The run's metrics on disk (recipe field log.dir): each progress line's numbers, and each
// evaluation's, as one MetricsRecord to TensorBoard's event file and metrics.jsonl
// (engine/metrics/metrics_logger.h). Rank 0 only; torch-free.
#pragma once
#include <memory>
#include <string>

#include "engine/train/log_record.h"

namespace me::metrics {
class MetricsLogger;
}

namespace me::train {

class RunMetrics {
 public:
  // Opens <dir>/tensorboard/events.out.tfevents.* and <dir>/metrics.jsonl and writes the
  // resolved recipe (`recipe_text`) as step 0's text summary. me::Error naming the path.
  RunMetrics(const std::string& dir, const std::string& recipe_text);
  ~RunMetrics();

  // The progress line `r` as a "train" record at r.iteration, and an "eval" record when an
  // evaluation ran there. peak_memory_bytes: LibTorch's allocator peak (0 without CUDA: not written).
  void write(const LogRecord& r, double peak_memory_bytes);

  const std::string& event_file() const;

 private:
  std::unique_ptr<metrics::MetricsLogger> logger_;
};

}  // namespace me::train
