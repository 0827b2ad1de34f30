#include "engine/train/pipeline.h"

#include <deque>

#include "engine/core/error.h"
#include "engine/parallel/mappings.h"

namespace me::train {

PipelineSchedule::PipelineSchedule(model::TransformerImpl& model, comm::ProcessGroup* pp)
    : model_(model), pp_(pp && pp->size() > 1 ? pp : nullptr) {
  stages_ = model.stage().count;
  stage_ = model.stage().index;
  ME_CHECK((pp_ ? pp_->size() : 1) == stages_ && (pp_ ? pp_->rank() : 0) == stage_, "pipeline: the model is stage ",
           stage_, " of ", stages_, " but this rank is ", pp_ ? pp_->rank() : 0, " of a pipeline group of ",
           pp_ ? pp_->size() : 1);
  const auto& tp = model.tensor_parallel();
  hidden_ = model.config().hidden;
  seq_divisor_ = tp.sequence_parallel ? tp.size() : 1;
  options_ = model.parameters().front().options().requires_grad(false);
}

torch::Tensor PipelineSchedule::transfer(const torch::Tensor& out, int to, int from, const torch::Tensor& tokens,
                                         int64_t rows) {
  std::vector<comm::PeerOp> ops;
  if (out.defined() && to >= 0) ops.push_back({comm::PeerOp::send, out.contiguous(), to});
  torch::Tensor got;
  if (from >= 0) {
    got = torch::empty({rows, tokens.size(1) / seq_divisor_, hidden_}, options_);
    ops.push_back({comm::PeerOp::recv, got, from});
  }
  if (!ops.empty()) pp_->send_recv(ops);
  return got;
}

torch::Tensor PipelineSchedule::share_loss(torch::Tensor sum) {
  if (pp_) pp_->all_reduce(sum, comm::ReduceOp::sum);  // the other stages hold zeros
  return sum;
}

torch::Tensor PipelineSchedule::train(const torch::Tensor& tokens, const torch::Tensor& labels, int64_t micro,
                                      int64_t micro_batches, double loss_scale, const Hooks& hooks) {
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  const int prev = first ? -1 : stage_ - 1, next = last ? -1 : stage_ + 1;
  auto loss_sum = torch::zeros({1}, options_.dtype(torch::kFloat));
  auto mark = [&](int phase) {
    if (hooks.mark) hooks.mark(phase);
  };
  auto move = [&](const torch::Tensor& out, int to, int from) {
    auto got = transfer(out, to, from, tokens, micro);
    if (to >= 0 || from >= 0) mark(3);
    return got;
  };

  // (input, output) of the micro-batches whose backward is still to come, oldest first.
  std::deque<std::pair<torch::Tensor, torch::Tensor>> alive;
  int64_t forwards = 0, backwards = 0;
  // Forward of the next micro-batch; on the last stage its output is the loss.
  auto forward = [&](torch::Tensor input) {
    const int64_t m = forwards++;
    if (first) input = tokens.narrow(0, m * micro, micro);
    else input.requires_grad_(true);  // its gradient goes back to the previous stage
    torch::Tensor out;
    if (last) {
      out = model_.stage_loss(input, labels.narrow(0, m * micro, micro)) / static_cast<double>(micro_batches);
      loss_sum += out.detach().to(torch::kFloat);
    } else {
      out = model_.forward_stage(input);
    }
    alive.emplace_back(input, out);
    mark(1);
    return out;
  };
  // Backward of the oldest micro-batch alive, given its output's gradient (none on the last
  // stage); returns its input's gradient (none on the first stage).
  auto backward = [&](const torch::Tensor& grad_out) {
    const auto [input, out] = alive.front();
    alive.pop_front();
    const int64_t m = backwards++;
    if (hooks.before_backward) hooks.before_backward(m, m == micro_batches - 1);
    if (last) (loss_scale != 1.0 ? out * loss_scale : out).backward();
    else torch::autograd::backward({out}, {grad_out});
    if (hooks.after_backward) hooks.after_backward();
    mark(2);
    return first ? torch::Tensor() : input.grad();
  };

  const int64_t warmup = std::min<int64_t>(stages_ - stage_ - 1, micro_batches);
  const int64_t steady = micro_batches - warmup;
  for (int64_t i = 0; i < warmup; ++i) move(forward(move({}, -1, prev)), next, -1);
  torch::Tensor input = steady > 0 ? move({}, -1, prev) : torch::Tensor();
  for (int64_t i = 0; i < steady; ++i) {
    const auto grad_out = move(forward(input), next, next);  // send forward, receive backward
    const auto grad_in = backward(grad_out);
    input = move(grad_in, prev, i + 1 < steady ? prev : -1);  // send backward, receive forward
  }
  for (int64_t i = 0; i < warmup; ++i) move(backward(move({}, -1, next)), prev, -1);
  return share_loss(loss_sum);
}

torch::Tensor PipelineSchedule::forward_only(const torch::Tensor& tokens) {
  torch::NoGradGuard no_grad;
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  auto input = first ? tokens : transfer({}, -1, stage_ - 1, tokens, tokens.size(0));
  auto out = model_.forward_stage(input);
  if (last) return out;
  transfer(out, stage_ + 1, -1, tokens, tokens.size(0));
  return {};
}

torch::Tensor PipelineSchedule::loss(const torch::Tensor& tokens, const torch::Tensor& labels) {
  torch::NoGradGuard no_grad;
  const auto logits = forward_only(tokens);
  return share_loss(logits.defined() ? parallel::vocab_parallel_cross_entropy(logits, labels, model_.tensor_parallel())
                                           .to(torch::kFloat)
                                           .reshape({1})
                                     : torch::zeros({1}, options_.dtype(torch::kFloat)));
}

torch::Tensor PipelineSchedule::last_logits(const torch::Tensor& tokens) {
  const auto& tp = model_.tensor_parallel();
  const auto out = forward_only(model::pad_for_sequence_parallel(tokens, tp));
  auto logits = out.defined() ? parallel::gather_last(out, tp).select(1, tokens.size(1) - 1).squeeze(0).to(torch::kFloat).contiguous()
                              : torch::empty({model_.config().padded_vocab(tp.size())}, options_.dtype(torch::kFloat));
  if (pp_) pp_->broadcast(logits, stages_ - 1);
  return logits;
}

}  // namespace me::train
