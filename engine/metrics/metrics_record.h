// What the trainer logs each interval and each evaluation, as one record of named scalars that
// every metrics sink takes (TensorBoard event file, metrics.jsonl). Torch-free.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace me::metrics {

// The keys of the scalars the trainer fills (JSON keys in metrics.jsonl). Their TensorBoard
// tags are in known_metrics(): Megatron-LM's where it has one.
namespace key {
inline constexpr const char* lm_loss = "lm_loss";
inline constexpr const char* learning_rate = "learning_rate";
inline constexpr const char* grad_norm = "grad_norm";
inline constexpr const char* loss_scale = "loss_scale";
inline constexpr const char* skipped_iterations = "skipped_iterations";
inline constexpr const char* nan_iterations = "nan_iterations";
inline constexpr const char* iteration_time_s = "iteration_time_s";
inline constexpr const char* tokens_per_s = "tokens_per_s";
inline constexpr const char* tflops_per_gpu = "tflops_per_gpu";
inline constexpr const char* mfu = "mfu";
inline constexpr const char* peak_memory_bytes = "peak_memory_bytes";
inline constexpr const char* consumed_samples = "consumed_samples";
inline constexpr const char* batch_size = "batch_size";
inline constexpr const char* val_loss = "val_loss";
inline constexpr const char* val_ppl = "val_ppl";
}  // namespace key

struct MetricInfo {
  const char* key;              // JSON key
  const char* tensorboard_tag;  // tag in the event file
  const char* kind;             // "train" or "eval": the record it belongs to
  const char* meaning;          // unit and where the value comes from
};

// Every metric the trainer logs, in the order it logs them.
const std::vector<MetricInfo>& known_metrics();
// The TensorBoard tag of a key: the table's, else the key itself (a metric added later).
std::string tensorboard_tag(const std::string& key);

struct MetricsRecord {
  std::string kind = "train";  // "train": one log interval; "eval": one evaluation
  int64_t step = 0;            // the iteration the record belongs to (TensorBoard's x axis)
  double wall_time = 0;        // seconds since the epoch; 0: stamped by the sink when written
  std::vector<std::pair<std::string, double>> values;  // (key, value) in the order set

  // Sets `key` (replacing an earlier value of it). NaN and infinities are kept: a sink writes them.
  MetricsRecord& set(const std::string& key, double value);
  std::optional<double> get(const std::string& key) const;
};

// Seconds since the epoch, with sub-second precision.
double unix_time_now();

}  // namespace me::metrics
