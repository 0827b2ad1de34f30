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

// One train() call: the micro-batches whose backward is still to come, the loss so far, and
// the forward / backward / transfer steps the schedule is made of.
class PipelineSchedule::StepRun {
 public:
  StepRun(PipelineSchedule& p, const torch::Tensor& tokens, const torch::Tensor& labels, int64_t micro,
          int64_t micro_batches, double loss_scale, const Hooks& hooks)
      : p_(p), tokens_(tokens), labels_(labels), micro_(micro), micro_batches_(micro_batches),
        loss_scale_(loss_scale), hooks_(hooks), first_(p.stage_ == 0), last_(p.stage_ == p.stages_ - 1) {
    loss_sum = torch::zeros({1}, p.options_.dtype(torch::kFloat));
  }

  Transfer move(const torch::Tensor& out, int to, int from) { return p_.transfer(out, to, from, tokens_, micro_); }

  torch::Tensor arrive(Transfer& t) {
    const bool any = t.work != nullptr;
    auto got = t.wait();
    if (any) mark(Phase::reduce);
    return got;
  }

  // Forward of the next micro-batch; on the last stage its output is the loss.
  torch::Tensor forward(torch::Tensor input) {
    if (hooks_.before_micro_batch) hooks_.before_micro_batch(false);
    const int64_t m = forwards_++;
    if (first_) input = tokens_.narrow(0, m * micro_, micro_);
    else input.requires_grad_(true);  // its gradient goes back to the previous stage
    torch::Tensor out;
    if (last_) {
      out = p_.model_.stage_loss(input, labels_.narrow(0, m * micro_, micro_)) / static_cast<double>(micro_batches_);
      loss_sum += out.detach().to(torch::kFloat);
    } else {
      out = p_.model_.forward_stage(input);
    }
    alive_.emplace_back(input, out);
    mark(Phase::forward);
    return out;
  }

  // Backward of the oldest micro-batch alive, given its output's gradient (none on the last
  // stage); returns its input's gradient (none on the first stage). Weight gradients are held
  // back in held_ under deferred_wgrads_.
  torch::Tensor backward(const torch::Tensor& grad_out) {
    if (hooks_.before_micro_batch) hooks_.before_micro_batch(true);
    const auto [input, out] = alive_.front();
    alive_.pop_front();
    struct HoldBack {  // the sink queues weight gradients only during this backward
      parallel::MainGradSink* sink;
      ~HoldBack() {
        if (sink) sink->hold_back_into(nullptr);
      }
    } hold{p_.deferred_wgrads_ > 0 ? p_.sink_ : nullptr};
    if (hold.sink) {
      p_.held_.begin_micro_batch();
      hold.sink->hold_back_into(&p_.held_);
    }
    if (last_) (loss_scale_ != 1.0 ? out * loss_scale_ : out).backward();
    else torch::autograd::backward({out}, {grad_out});
    if (hooks_.after_backward) hooks_.after_backward();
    mark(Phase::backward);
    return first_ ? torch::Tensor() : input.grad();
  }

  // Runs held-back weight gradients, oldest first, until `keep` micro-batches' remain.
  void run_held(size_t keep) {
    if (p_.held_.micro_batches() <= keep) return;
    p_.held_.run_down_to(keep);
    mark(Phase::backward);
  }

  torch::Tensor loss_sum;

 private:
  void mark(Phase phase) {
    if (hooks_.mark) hooks_.mark(phase);
  }

  PipelineSchedule& p_;
  const torch::Tensor &tokens_, &labels_;
  int64_t micro_, micro_batches_;
  double loss_scale_;
  const Hooks& hooks_;
  bool first_, last_;
  std::deque<std::pair<torch::Tensor, torch::Tensor>> alive_;  // (input, output), oldest first
  int64_t forwards_ = 0;
};

torch::Tensor PipelineSchedule::train(const torch::Tensor& tokens, const torch::Tensor& labels, int64_t micro,
                                      int64_t micro_batches, double loss_scale, const Hooks& hooks) {
  const int prev = stage_ > 0 ? stage_ - 1 : -1, next = stage_ < stages_ - 1 ? stage_ + 1 : -1;
  held_.clear();  // a step that threw part-way may have left its GEMMs behind
  parallel::DelayedWeightGrad::drop();
  StepRun run(*this, tokens, labels, micro, micro_batches, loss_scale, hooks);
  // After a backward's send, the stage keeps at most deferred_wgrads_ - 1 micro-batches' weight
  // gradients held (1: each runs right after its own input gradient has left).
  const size_t keep = deferred_wgrads_ > 0 ? static_cast<size_t>(deferred_wgrads_ - 1) : 0;

  const int64_t warmup = std::min<int64_t>(stages_ - stage_ - 1, micro_batches);
  const int64_t steady = micro_batches - warmup;
  std::vector<Transfer> sends;  // sends only: waited for at the end
  for (int64_t i = 0; i < warmup; ++i) {
    auto in = run.move({}, -1, prev);
    sends.push_back(run.move(run.forward(run.arrive(in)), next, -1));
  }
  Transfer input = steady > 0 ? run.move({}, -1, prev) : Transfer{};
  for (int64_t i = 0; i < steady; ++i) {
    auto exchange = run.move(run.forward(run.arrive(input)), next, next);  // send forward, receive backward
    const auto grad_in = run.backward(run.arrive(exchange));
    input = run.move(grad_in, prev, i + 1 < steady ? prev : -1);  // send backward, receive forward
    run.run_held(keep);  // while the previous stage computes the next forward
  }
  sends.push_back(std::move(input));
  for (int64_t i = 0; i < warmup; ++i) {
    auto grad_out = run.move({}, -1, next);
    // While the gradient comes: backward work, not the wait for the gradient.
    if (held_.micro_batches() > 0) run.run_held(held_.micro_batches() - 1);
    sends.push_back(run.move(run.backward(run.arrive(grad_out)), prev, -1));
    run.run_held(keep);
  }
  run.run_held(0);
  for (auto& t : sends) run.arrive(t);
  return share_loss(run.loss_sum);
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
  if (!logits.defined()) return share_loss(torch::zeros({1}, options_.dtype(torch::kFloat)));
  const auto& tp = model_.tensor_parallel();
  return share_loss(
      parallel::vocab_parallel_cross_entropy(logits, labels, tp, -100, model_.config().vocab).to(torch::kFloat).reshape({1}));
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
