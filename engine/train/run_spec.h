// Everything a training run is made of, as plain data (config is data): the Lua bindings
// fill it from the recipe table, the trainer consumes it. No LibTorch here.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "engine/model/transformer_config.h"
#include "engine/optim/lr_schedule.h"

namespace me::train {

struct DataSpec {
  std::string kind = "text";  // byte-level text file
  std::string path;
  double holdout = 0.05;
};

struct OptimSpec {
  std::string kind = "adamw";
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, clip = 1.0;
};

struct TrainSpec {
  int64_t iters = 100;
  int64_t micro_batch = 8;
  int64_t log_interval = 10;
  int64_t eval_interval = 0;  // 0: evaluate only at the end
  int64_t eval_iters = 10;    // 0: no evaluation (benchmark mode)
};

struct SampleSpec {
  std::string prompt = "\n";
  int64_t tokens = 0;  // 0: no sample at the end
  int64_t top_k = 1;
  double temperature = 1.0;
};

// One progress line's numbers, handed to Lua hooks (`on_log`) as a table.
struct LogRecord {
  int64_t iteration = 0, iters = 0, consumed_samples = 0;
  double lr = 0, loss = 0, grad_norm = 0, ms_per_iter = 0, tokens_per_s = 0;
  double val_loss = -1;  // < 0 when no evaluation ran at this iteration
};

struct RunSpec {
  std::string name = "run";
  std::string device = "cpu";
  uint64_t seed = 1234;
  model::TransformerConfig model;
  DataSpec data;
  OptimSpec optim;
  optim::LRSchedule schedule;  // decay 0 means "train.iters"
  TrainSpec train;
  SampleSpec sample;
  std::function<void(const LogRecord&)> on_log;  // may throw me::Error to stop the run
};

}  // namespace me::train
