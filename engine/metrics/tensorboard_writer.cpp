#include "engine/metrics/tensorboard_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/core/error.h"
#include "engine/metrics/crc32c.h"
#include "engine/metrics/file_util.h"
#include "engine/metrics/proto_encoder.h"

namespace me::metrics {
namespace {

// Field numbers, from tensorboard/compat/proto/*.proto.
namespace event {  // message Event
constexpr int wall_time = 1, step = 2, file_version = 3, summary = 5;
}
namespace summary {  // message Summary { repeated Value value = 1; }
constexpr int value = 1;
}
namespace value {  // message Summary.Value
constexpr int tag = 1, simple_value = 2, tensor = 8, metadata = 9;
}
namespace metadata {  // message SummaryMetadata { PluginData plugin_data = 1; } / PluginData
constexpr int plugin_data = 1, plugin_name = 1;
}
namespace tensor {  // message TensorProto; DataType DT_STRING = 7 (types.proto)
constexpr int dtype = 1, tensor_shape = 2, string_val = 8, dt_string = 7;
}

std::string event_header(double wall_time, int64_t step) {
  ProtoEncoder e;
  e.fixed64_double(event::wall_time, wall_time > 0 ? wall_time : unix_time_now());
  if (step != 0) e.varint(event::step, step);  // proto3 leaves default values out
  return e.bytes();
}

std::string little_endian(uint64_t v, int width) {
  std::string out;
  for (int i = 0; i < width; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return out;
}

}  // namespace

std::string tf_record(const std::string& data) {
  const std::string length = little_endian(data.size(), 8);
  return length + little_endian(mask_crc(me::crc32c(0, length.data(), length.size())), 4) + data +
         little_endian(mask_crc(me::crc32c(0, data.data(), data.size())), 4);
}

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir) {
  const std::string dir = log_dir + "/tensorboard";
  detail::make_dirs(dir, "log.dir");
  const double now = unix_time_now();
  const std::string base = cat(dir, "/events.out.tfevents.", static_cast<int64_t>(now), ".", detail::host_name());
  // TensorBoard reads every file whose name holds "tfevents": a suffix keeps a second writer
  // of the same second (a quick restart) from clobbering the first.
  for (int attempt = 0; attempt < 100 && !file_; ++attempt) {
    path_ = attempt == 0 ? base : attempt == 1 ? cat(base, ".", ::getpid()) : cat(base, ".", ::getpid(), ".", attempt);
    file_ = detail::open_new(path_);
    if (!file_ && errno != EEXIST) break;
  }
  if (!file_) fail("cannot create the TensorBoard event file '", path_, "': ", std::strerror(errno), " (check log.dir)");
  write_event(event_header(now, 0) + ProtoEncoder().bytes(event::file_version, "brain.Event:2").bytes());
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::write_event(const std::string& event) {
  detail::write_and_flush(file_, tf_record(event), path_);
}

void TensorBoardWriter::write_scalars(const MetricsRecord& record) {
  if (record.values.empty()) return;
  ProtoEncoder sum;
  for (const auto& [k, v] : record.values) {
    ProtoEncoder val;
    val.bytes(value::tag, tensorboard_tag(k)).fixed32_float(value::simple_value, static_cast<float>(v));
    sum.bytes(summary::value, val.bytes());
  }
  write_event(event_header(record.wall_time, record.step) + ProtoEncoder().bytes(event::summary, sum.bytes()).bytes());
}

void TensorBoardWriter::write_text(const std::string& tag, const std::string& markdown, int64_t step, double wall_time) {
  // The text plugin's content is a TextPluginData{version = 0}: an empty message, so no field.
  ProtoEncoder plugin;
  plugin.bytes(metadata::plugin_name, "text");
  ProtoEncoder meta;
  meta.bytes(metadata::plugin_data, plugin.bytes());
  // A scalar string tensor: a shape with no dimensions, present (as TensorFlow writes it).
  ProtoEncoder t;
  t.varint(tensor::dtype, tensor::dt_string).bytes(tensor::tensor_shape, "").bytes(tensor::string_val, markdown);
  ProtoEncoder val;
  val.bytes(value::tag, tag).bytes(value::tensor, t.bytes()).bytes(value::metadata, meta.bytes());  // field order
  ProtoEncoder sum;
  sum.bytes(summary::value, val.bytes());
  write_event(event_header(wall_time, step) + ProtoEncoder().bytes(event::summary, sum.bytes()).bytes());
}

}  // namespace me::metrics
