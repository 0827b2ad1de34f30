// <log_dir>/metrics.jsonl: one JSON object per line, one line per MetricsRecord:
//   {"kind": "train", "step": 10, "wall_time": 1764000000.123, "lm_loss": 5.12, ...}
// Numbers are written with 17 significant digits (doubles round-trip exactly). NaN and the
// infinities, which JSON has no numbers for, are written as the strings "NaN", "Infinity" and
// "-Infinity" (so every line stays valid JSON, and Python's float() reads them back).
// The file is opened for appending: a resumed run continues the same file (the "step" of each
// line tells the runs apart). Each line is flushed when written, for `tail -f`.
#pragma once
#include <cstdio>
#include <string>

#include "engine/metrics/metrics_record.h"

namespace me::metrics {

class JsonlMetricsWriter {
 public:
  // Creates log_dir (and its parents) and opens log_dir/metrics.jsonl; me::Error naming the path.
  explicit JsonlMetricsWriter(const std::string& log_dir);
  ~JsonlMetricsWriter();
  JsonlMetricsWriter(const JsonlMetricsWriter&) = delete;
  JsonlMetricsWriter& operator=(const JsonlMetricsWriter&) = delete;

  void write(const MetricsRecord& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// One record as its JSON line (without the newline); exposed for tests.
std::string to_json(const MetricsRecord& record);
// A JSON string literal: quotes, backslashes and control characters escaped.
std::string json_string(const std::string& s);
// A double as JSON: a number, or "NaN" / "Infinity" / "-Infinity" as strings.
std::string json_number(double v);

}  // namespace me::metrics
