#include "engine/metrics/jsonl_writer.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include "engine/core/error.h"
#include "engine/metrics/file_util.h"

namespace me::metrics {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;  // UTF-8 passes through as is
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (std::isnan(v)) return "\"NaN\"";
  if (std::isinf(v)) return v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string to_json(const MetricsRecord& r) {
  std::string out = "{\"kind\": " + json_string(r.kind) + ", \"step\": " + std::to_string(r.step);
  out += ", \"wall_time\": " + json_number(r.wall_time > 0 ? r.wall_time : unix_time_now());
  for (const auto& [k, v] : r.values) out += ", " + json_string(k) + ": " + json_number(v);
  return out + "}";
}

JsonlMetricsWriter::JsonlMetricsWriter(const std::string& log_dir) : path_(log_dir + "/metrics.jsonl") {
  detail::make_dirs(log_dir, "log.dir");
  file_ = std::fopen(path_.c_str(), "ae");  // "e": close-on-exec, so ranks' children do not inherit it
  if (!file_) fail("cannot open '", path_, "' for appending: ", std::strerror(errno), " (check log.dir)");
}

JsonlMetricsWriter::~JsonlMetricsWriter() {
  if (file_) std::fclose(file_);
}

void JsonlMetricsWriter::write(const MetricsRecord& record) {
  detail::write_and_flush(file_, to_json(record) + "\n", path_);
}

}  // namespace me::metrics
