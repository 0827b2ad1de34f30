// TensorBoard's event file, written without TensorFlow or libprotobuf:
// <log_dir>/tensorboard/events.out.tfevents.<unix time>.<host>, a TFRecord file of Event
// protobufs. Each record: uint64 length (little-endian), masked CRC-32C of those 8 bytes, the
// Event, masked CRC-32C of the Event. The first Event carries file_version "brain.Event:2".
// Field numbers are those of tensorboard/compat/proto/{event,summary,tensor,tensor_shape,types}.proto.
// Every write is flushed, so `tensorboard --logdir` and `wandb sync` see a run live.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

#include "engine/metrics/metrics_record.h"

namespace me::metrics {

class TensorBoardWriter {
 public:
  // Creates <log_dir>/tensorboard (and its parents) and a new event file in it (a second writer
  // within the same second gets ".<pid>", then ".<pid>.<n>", appended). me::Error naming the path
  // when it cannot be created.
  explicit TensorBoardWriter(const std::string& log_dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event at record.step holding a Summary with one simple_value per scalar, tagged by
  // tensorboard_tag(key). simple_value is a float: values are rounded to float32.
  void write_scalars(const MetricsRecord& record);
  // A text summary for TensorBoard's Text tab (plugin "text", a DT_STRING scalar tensor);
  // `markdown` is rendered as Markdown.
  void write_text(const std::string& tag, const std::string& markdown, int64_t step, double wall_time = 0);

  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

// The TFRecord framing of one record, exposed for tests: length, masked CRC of the length,
// data, masked CRC of the data.
std::string tf_record(const std::string& data);

}  // namespace me::metrics
