#include "engine/train/run_metrics.h"

#include <cmath>

#include "engine/metrics/metrics_logger.h"

namespace me::train {

RunMetrics::RunMetrics(const std::string& dir, const std::string& recipe_text)
    : logger_(std::make_unique<metrics::MetricsLogger>(dir)) {
  logger_->write_recipe(recipe_text, 0);
}

RunMetrics::~RunMetrics() = default;

const std::string& RunMetrics::event_file() const { return logger_->event_file(); }

void RunMetrics::write(const LogRecord& r, double peak_memory_bytes) {
  namespace key = metrics::key;
  metrics::MetricsRecord rec;
  rec.kind = "train";
  rec.step = r.iteration;
  rec.set(key::lm_loss, r.loss)
      .set(key::learning_rate, r.lr)
      .set(key::grad_norm, r.grad_norm)
      .set(key::skipped_iterations, static_cast<double>(r.skipped))
      .set(key::nan_iterations, static_cast<double>(r.nan))
      .set(key::iteration_time_s, r.ms_per_iter / 1000.0)
      .set(key::tokens_per_s, r.tokens_per_s)
      .set(key::tflops_per_gpu, r.tflops_per_gpu)
      .set(key::consumed_samples, static_cast<double>(r.consumed_samples))
      .set(key::batch_size, static_cast<double>(r.global_batch));
  if (r.loss_scale > 0) rec.set(key::loss_scale, r.loss_scale);
  if (r.mfu > 0) rec.set(key::mfu, r.mfu);
  if (peak_memory_bytes > 0) rec.set(key::peak_memory_bytes, peak_memory_bytes);
  logger_->write(rec);
  if (r.val_loss < 0) return;
  metrics::MetricsRecord eval;
  eval.kind = "eval";
  eval.step = r.iteration;
  // Perplexity as Megatron reports it: exp of the mean loss, capped where exp overflows.
  eval.set(key::val_loss, r.val_loss).set(key::val_ppl, std::exp(std::min(r.val_loss, 20.0)));
  logger_->write(eval);
}

}  // namespace me::train
