#include "engine/train/pipeline.h"

#include <deque>

#include "engine/core/error.h"
#include "engine/parallel/mappings.h"

namespace me::train {

PipelineSchedule::PipelineSchedule(model::TransformerImpl& model, comm::ProcessGroup* pp, int64_t deferred_wgrads,
                                   parallel::MainGradSink* sink)
    : model_(model), pp_(pp && pp->size() > 1 ? pp : nullptr), deferred_wgrads_(deferred_wgrads), sink_(sink) {
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

torch::Tensor PipelineSchedule::Transfer::wait() {
  if (work) work->wait();
  work.reset();
  return got;
}

PipelineSchedule::Transfer PipelineSchedule::transfer(const torch::Tensor& out, int to, int from,
                                                      const torch::Tensor& tokens, int64_t rows) {
  std::vector<comm::PeerOp> ops;
  if (out.defined() && to >= 0) ops.push_back({comm::PeerOp::send, out.contiguous(), to});
  Transfer t;
  if (from >= 0) {
    t.got = torch::empty({rows, tokens.size(1) / seq_divisor_, hidden_}, options_);
    ops.push_back({comm::PeerOp::recv, t.got, from});
  }
  if (ops.empty()) return t;
  std::vector<torch::Tensor> uses;
  for (const auto& op : ops) uses.push_back(op.tensor);
  transfers_.run(options_.device(), [&] { t.work = pp_->send_recv(ops, /*async=*/true); }, uses);
  return t;
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
  held_.clear();  // a step that threw part-way may have left its GEMMs behind
  auto mark = [&](int phase) {
    if (hooks.mark) hooks.mark(phase);
  };
  auto move = [&](const torch::Tensor& out, int to, int from) { return transfer(out, to, from, tokens, micro); };
  auto arrive = [&](Transfer& t) {
    const bool any = t.work != nullptr;
    auto got = t.wait();
    if (any) mark(3);
    return got;
  };

  // (input, output) of the micro-batches whose backward is still to come, oldest first.
  std::deque<std::pair<torch::Tensor, torch::Tensor>> alive;
  int64_t forwards = 0;
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
  // stage); returns its input's gradient (none on the first stage). Weight gradients are held
  // back in held_ under deferred_wgrads_.
  auto backward = [&](const torch::Tensor& grad_out) {
    const auto [input, out] = alive.front();
    alive.pop_front();
    struct HoldBack {  // the sink queues weight gradients only during this backward
      parallel::MainGradSink* sink;
      ~HoldBack() {
        if (sink) sink->hold_back_into(nullptr);
      }
    } hold{deferred_wgrads_ > 0 ? sink_ : nullptr};
    if (hold.sink) {
      held_.begin_micro_batch();
      hold.sink->hold_back_into(&held_);
    }
    if (last) (loss_scale != 1.0 ? out * loss_scale : out).backward();
    else torch::autograd::backward({out}, {grad_out});
    if (hooks.after_backward) hooks.after_backward();
    mark(2);
    return first ? torch::Tensor() : input.grad();
  };
  // Runs held-back weight gradients, oldest first, until `keep` micro-batches' remain.
  auto run_held = [&](size_t keep) {
    if (held_.micro_batches() <= keep) return;
    held_.run_down_to(keep);
    mark(2);
  };
  // After a backward's send, the stage keeps at most deferred_wgrads_ - 1 micro-batches' weight
  // gradients held (1: each runs right after its own input gradient has left).
  const size_t keep = deferred_wgrads_ > 0 ? static_cast<size_t>(deferred_wgrads_ - 1) : 0;

  const int64_t warmup = std::min<int64_t>(stages_ - stage_ - 1, micro_batches);
  const int64_t steady = micro_batches - warmup;
  std::vector<Transfer> sends;  // sends only: waited for at the end
  for (int64_t i = 0; i < warmup; ++i) {
    auto in = move({}, -1, prev);
    sends.push_back(move(forward(arrive(in)), next, -1));
  }
  Transfer input = steady > 0 ? move({}, -1, prev) : Transfer{};
  for (int64_t i = 0; i < steady; ++i) {
    auto exchange = move(forward(arrive(input)), next, next);  // send forward, receive backward
    const auto grad_in = backward(arrive(exchange));
    input = move(grad_in, prev, i + 1 < steady ? prev : -1);  // send backward, receive forward
    run_held(keep);  // while the previous stage computes the next forward
  }
  sends.push_back(std::move(input));
  for (int64_t i = 0; i < warmup; ++i) {
    auto grad_out = move({}, -1, next);
    if (held_.micro_batches() > 0) {  // while the gradient comes
      held_.run_oldest();
      mark(2);  // backward work, not the wait for the gradient
    }
    sends.push_back(move(backward(arrive(grad_out)), prev, -1));
    run_held(keep);
  }
  run_held(0);
  for (auto& t : sends) arrive(t);
  return share_loss(loss_sum);
}

torch::Tensor PipelineSchedule::forward_only(const torch::Tensor& tokens) {
  torch::NoGradGuard no_grad;
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  auto input = first ? tokens : transfer({}, -1, stage_ - 1, tokens, tokens.size(0)).wait();
  auto out = model_.forward_stage(input);
  if (last) return out;
  transfer(out, stage_ + 1, -1, tokens, tokens.size(0)).wait();
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
