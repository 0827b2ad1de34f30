#include "engine/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/core/torch_compat.h"

namespace me::train {
namespace {

torch::Device parse_device(const std::string& name) {
  if (name == "cpu") return torch::kCPU;
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    ME_CHECK(compat::cuda_available(), "device '", name,
             "' asked for, but this LibTorch build sees no CUDA GPU: use device=cpu");
    return torch::Device(name);
  }
  fail("unknown device '", name, "': expected cpu, cuda or cuda:N");
}

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Trainer::Trainer(RunSpec spec) : spec_(std::move(spec)), device_(parse_device(spec_.device)), rng_(spec_.seed) {
  auto& t = spec_.train;
  ME_CHECK(t.iters > 0, "train.iters must be a positive integer, got ", t.iters);
  ME_CHECK(t.micro_batch > 0, "batch.micro must be a positive integer, got ", t.micro_batch);
  ME_CHECK(t.log_interval > 0, "train.log_interval must be a positive integer, got ", t.log_interval);
  ME_CHECK(t.eval_interval >= 0 && t.eval_iters >= 0, "train.eval_interval and train.eval_iters must be >= 0");
  ME_CHECK(spec_.optim.kind == "adamw", "optimizer kind '", spec_.optim.kind, "' is not available yet: use me.optim.adamw");
  ME_CHECK(spec_.optim.clip >= 0, "optimizer.clip must be >= 0 (0 turns clipping off), got ", spec_.optim.clip);
  ME_CHECK(spec_.data.kind == "text", "data kind '", spec_.data.kind, "' is not available yet: use me.data.text");
  spec_.model.validate();

  data_ = std::make_unique<data::ByteTextDataset>(spec_.data.path, spec_.data.holdout, spec_.model.seq);
  ME_CHECK(spec_.model.vocab >= data::ByteTextDataset::vocab(), "model.vocab (", spec_.model.vocab,
           ") is smaller than the byte-level tokenizer's 256 ids");

  auto& sched = spec_.schedule;
  sched.max_lr = spec_.optim.lr;
  if (sched.decay == 0) sched.decay = t.iters;
  sched.validate();

  model_ = model::Transformer(spec_.model);
  model_->reset_parameters(spec_.seed);
  model_->to(device_);
  params_ = model_->parameters();
  optim::AdamWConfig acfg{spec_.optim.beta1, spec_.optim.beta2, spec_.optim.eps, spec_.optim.weight_decay};
  optimizer_ = std::make_unique<optim::AdamW>(optim::decay_groups(params_, acfg.weight_decay), acfg);
}

StepResult Trainer::step() {
  const double t0 = now_ms();
  model_->train();
  auto batch = data_->sample(false, spec_.train.micro_batch, rng_);
  auto loss = model_->loss(batch.tokens.to(device_), batch.labels.to(device_));
  optimizer_->zero_grad();
  loss.backward();

  StepResult r;
  r.iteration = ++iteration_;
  r.grad_norm = optim::clip_grad_norm(params_, spec_.optim.clip);
  r.lr = spec_.schedule.lr(iteration_);
  // A NaN/Inf gradient would poison the weights and every later step: skip and count it.
  r.skipped = !std::isfinite(r.grad_norm);
  if (r.skipped) {
    ++skipped_;
    log::warn("iteration ", iteration_, ": gradient norm is ", r.grad_norm, ", update skipped");
  } else {
    optimizer_->step(r.lr);
  }
  r.loss = loss.item<double>();  // the one host sync of the step
  r.ms = now_ms() - t0;
  return r;
}

double Trainer::evaluate() {
  if (spec_.train.eval_iters == 0) return -1;
  torch::NoGradGuard no_grad;
  model_->eval();
  // The same validation windows every time, so evaluations are comparable.
  std::mt19937_64 rng(spec_.seed ^ 0x9e3779b97f4a7c15ULL);
  double sum = 0;
  for (int64_t i = 0; i < spec_.train.eval_iters; ++i) {
    auto batch = data_->sample(true, spec_.train.micro_batch, rng);
    sum += model_->loss(batch.tokens.to(device_), batch.labels.to(device_)).item<double>();
  }
  model_->train();
  return sum / static_cast<double>(spec_.train.eval_iters);
}

void Trainer::log_line(const LogRecord& r) const {
  char line[512];
  std::snprintf(line, sizeof line,
                " iteration %8lld/%8lld | consumed samples: %10lld | elapsed time per iteration (ms): %.1f | "
                "learning rate: %.3E | lm loss: %.6E | grad norm: %.3f | tokens/s: %.0f",
                static_cast<long long>(r.iteration), static_cast<long long>(r.iters),
                static_cast<long long>(r.consumed_samples), r.ms_per_iter, r.lr, r.loss, r.grad_norm, r.tokens_per_s);
  log::info(line);
  if (r.val_loss >= 0) {
    std::snprintf(line, sizeof line, " validation loss at iteration %lld | lm loss: %.6E | lm loss PPL: %.3f",
                  static_cast<long long>(r.iteration), r.val_loss, std::exp(r.val_loss));
    log::info(line);
  }
}

Summary Trainer::run() {
  const auto& t = spec_.train;
  log::info("training ", spec_.name, ": ", spec_.model.describe(), ", ", model_->local_parameter_count(), " parameters on ",
            spec_.device, "; ", data_->train_tokens(), " train / ", data_->valid_tokens(), " validation tokens");
  Summary s;
  double window_loss = 0, window_ms = 0;
  int64_t window_n = 0;
  const double tokens_per_step = static_cast<double>(t.micro_batch * spec_.model.seq);
  double total_ms = 0;
  while (iteration_ < t.iters) {
    const auto r = step();
    if (!r.skipped) {
      window_loss += r.loss;
      ++window_n;
    }
    window_ms += r.ms;
    total_ms += r.ms;
    s.last_loss = r.loss;
    const bool log_now = iteration_ % t.log_interval == 0 || iteration_ == t.iters;
    if (!log_now) continue;
    LogRecord rec;
    rec.iteration = iteration_;
    rec.iters = t.iters;
    rec.consumed_samples = iteration_ * t.micro_batch;
    rec.lr = r.lr;
    rec.loss = window_n ? window_loss / static_cast<double>(window_n) : r.loss;
    rec.grad_norm = r.grad_norm;
    const int64_t steps_in_window = (iteration_ - 1) % t.log_interval + 1;
    rec.ms_per_iter = window_ms / static_cast<double>(steps_in_window);
    rec.tokens_per_s = tokens_per_step * 1000.0 / rec.ms_per_iter;
    const bool eval_now = t.eval_iters > 0 && ((t.eval_interval > 0 && iteration_ % t.eval_interval == 0) || iteration_ == t.iters);
    if (eval_now) s.val_loss = rec.val_loss = evaluate();
    if (s.iterations == 0) s.first_loss = rec.loss;  // the first logged (window-mean) loss
    s.iterations = iteration_;
    s.last_loss = rec.loss;
    log_line(rec);
    if (spec_.on_log) spec_.on_log(rec);
    window_loss = window_ms = 0;
    window_n = 0;
  }
  s.iterations = iteration_;
  s.skipped = skipped_;
  s.tokens_per_s = total_ms > 0 ? tokens_per_step * static_cast<double>(iteration_) * 1000.0 / total_ms : 0;
  if (spec_.sample.tokens > 0) {
    s.sample = sample(spec_.sample.prompt, spec_.sample.tokens, spec_.sample.top_k, spec_.sample.temperature);
    log::info("sample (", spec_.sample.tokens, " tokens, top_k ", spec_.sample.top_k, "):\n", s.sample);
  }
  return s;
}

std::string Trainer::sample(const std::string& prompt, int64_t tokens, int64_t top_k, double temperature) {
  auto ids = data::ByteTextDataset::encode(prompt.empty() ? std::string("\n") : prompt);
  return data::ByteTextDataset::decode(model::generate(model_, ids, tokens, top_k, temperature, spec_.seed));
}

}  // namespace me::train
