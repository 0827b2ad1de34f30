#include "engine/metrics/metrics_logger.h"

#include <algorithm>

namespace me::metrics {

MetricsLogger::MetricsLogger(const std::string& dir) : tensorboard_(dir), jsonl_(dir) {}

void MetricsLogger::write(const MetricsRecord& record) {
  MetricsRecord stamped = record;
  if (stamped.wall_time <= 0) stamped.wall_time = unix_time_now();
  tensorboard_.write_scalars(stamped);
  jsonl_.write(stamped);
}

void MetricsLogger::write_recipe(const std::string& recipe_text, int64_t step) {
  // A fence longer than any run of backticks in the text, so the text cannot close it.
  size_t longest = 0, run = 0;
  for (const char c : recipe_text) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  const std::string fence(std::max<size_t>(3, longest + 1), '`');
  tensorboard_.write_text("recipe", fence + "lua\n" + recipe_text + (recipe_text.empty() || recipe_text.back() == '\n' ? "" : "\n") + fence, step);
}

}  // namespace me::metrics
