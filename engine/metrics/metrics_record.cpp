#include "engine/metrics/metrics_record.h"

#include <algorithm>
#include <chrono>

namespace me::metrics {

const std::vector<MetricInfo>& known_metrics() {
  static const std::vector<MetricInfo> table = {
      {key::lm_loss, "lm loss", "train", "mean training loss of the interval's applied (not skipped) iterations"},
      {key::learning_rate, "learning-rate", "train", "learning rate of the interval's last iteration"},
      {key::grad_norm, "grad-norm", "train", "gradient norm (before clipping) of the interval's last iteration"},
      {key::loss_scale, "loss-scale", "train", "fp16 dynamic loss scale (only under fp16)"},
      {key::skipped_iterations, "skipped-iterations", "train", "iterations skipped so far (non-finite gradients)"},
      {key::nan_iterations, "nan-iterations", "train", "iterations so far whose loss or gradient was NaN"},
      {key::iteration_time_s, "iteration-time", "train", "seconds per iteration over the interval"},
      {key::tokens_per_s, "tokens-per-sec", "train", "tokens per second over the interval, whole job"},
      {key::tflops_per_gpu, "throughput", "train", "model TFLOP/s per GPU over the interval"},
      {key::mfu, "mfu", "train", "model FLOPs utilisation: TFLOP/s per GPU / train.peak_tflops (fraction)"},
      {key::peak_memory_bytes, "mem-max-allocated-bytes", "train", "peak bytes allocated by tensors on rank 0's GPU"},
      {key::consumed_samples, "consumed-samples", "train", "samples consumed since the start of training"},
      {key::batch_size, "batch-size", "train", "global batch size in samples"},
      {key::val_loss, "lm loss validation", "eval", "mean loss over train.eval_iters validation batches"},
      {key::val_ppl, "lm loss validation ppl", "eval", "exp(validation loss)"},
  };
  return table;
}

std::string tensorboard_tag(const std::string& k) {
  for (const auto& m : known_metrics())
    if (k == m.key) return m.tensorboard_tag;
  return k;
}

MetricsRecord& MetricsRecord::set(const std::string& k, double value) {
  auto it = std::find_if(values.begin(), values.end(), [&](const auto& kv) { return kv.first == k; });
  if (it != values.end())
    it->second = value;
  else
    values.emplace_back(k, value);
  return *this;
}

std::optional<double> MetricsRecord::get(const std::string& k) const {
  for (const auto& [name, value] : values)
    if (name == k) return value;
  return std::nullopt;
}

double unix_time_now() {
  using namespace std::chrono;
  return duration_cast<duration<double>>(system_clock::now().time_since_epoch()).count();
}

}  // namespace me::metrics
