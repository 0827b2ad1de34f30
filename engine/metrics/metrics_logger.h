// The metrics of a run on disk (recipe field log.dir): rank 0 makes one MetricsLogger and hands
// it a MetricsRecord per log interval and per evaluation; it goes to both
//   <dir>/tensorboard/events.out.tfevents.<time>.<host>   (TensorBoard, `wandb sync --sync-tensorboard`)
//   <dir>/metrics.jsonl                                    (one JSON object per line)
// Torch-free; every record is flushed as it is written.
#pragma once
#include <string>

#include "engine/metrics/jsonl_writer.h"
#include "engine/metrics/metrics_record.h"
#include "engine/metrics/tensorboard_writer.h"

namespace me::metrics {

class MetricsLogger {
 public:
  explicit MetricsLogger(const std::string& dir);  // me::Error naming the path it cannot create

  // The same wall time goes to both files (stamped now when the record has none).
  void write(const MetricsRecord& record);
  // The resolved recipe, at step 0 in TensorBoard's Text tab under the tag "recipe" (as a
  // fenced code block, so Lua's "--" and "#" are not taken for Markdown).
  void write_recipe(const std::string& recipe_text, int64_t step = 0);

  const std::string& event_file() const { return tensorboard_.path(); }
  const std::string& jsonl_file() const { return jsonl_.path(); }

 private:
  TensorBoardWriter tensorboard_;
  JsonlMetricsWriter jsonl_;
};

}  // namespace me::metrics
