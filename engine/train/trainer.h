// The training loop, single process for now: one step reads a batch, runs forward and
// backward, clips, sets the learning rate and updates. Later issues add data parallelism,
// pipelining and checkpoints here rather than in a second loop.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <random>

#include "engine/data/byte_text.h"
#include "engine/model/transformer.h"
#include "engine/optim/adamw.h"
#include "engine/train/run_spec.h"

namespace me::train {

struct StepResult {
  int64_t iteration = 0;
  double loss = 0, grad_norm = 0, lr = 0, ms = 0;
  bool skipped = false;  // non-finite gradient norm: update not applied
};

struct Summary {
  int64_t iterations = 0;
  double first_loss = 0, last_loss = 0, val_loss = -1;
  double tokens_per_s = 0;
  int64_t skipped = 0;
  std::string sample;  // decoded text sampled at the end, if asked for
};

class Trainer {
 public:
  explicit Trainer(RunSpec spec);

  StepResult step();
  double evaluate();   // mean validation loss over train.eval_iters fixed batches
  Summary run();       // steps until train.iters, logging and evaluating on the way
  std::string sample(const std::string& prompt, int64_t tokens, int64_t top_k, double temperature);

  model::Transformer& model() { return model_; }
  const RunSpec& spec() const { return spec_; }
  int64_t iteration() const { return iteration_; }
  void set_on_log(std::function<void(const LogRecord&)> hook) { spec_.on_log = std::move(hook); }

 private:
  void log_line(const LogRecord& r) const;

  RunSpec spec_;
  torch::Device device_;
  std::unique_ptr<data::ByteTextDataset> data_;
  model::Transformer model_{nullptr};
  std::unique_ptr<optim::AdamW> optimizer_;
  std::vector<torch::Tensor> params_;
  std::mt19937_64 rng_;
  int64_t iteration_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace me::train
