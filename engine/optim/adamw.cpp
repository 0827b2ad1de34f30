#include "engine/optim/adamw.h"

#include <cmath>

#include "engine/core/error.h"

namespace me::optim {

std::vector<ParamGroup> decay_groups(const std::vector<torch::Tensor>& params, double weight_decay) {
  ParamGroup decay{{}, weight_decay}, no_decay{{}, 0.0};
  for (const auto& p : params) (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  return {decay, no_decay};
}

AdamW::AdamW(std::vector<ParamGroup> groups, OptimizerOptions options) : groups_(std::move(groups)), cfg_(std::move(options)) {
  cfg_.check();
  for (const auto& g : groups_) {
    exp_avg_.emplace_back();
    exp_avg_sq_.emplace_back();
    for (const auto& p : g.params) {
      // Moments in fp32 at least (fp64 parameters keep fp64): the optimizer's precision.
      const auto dtype = p.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
      exp_avg_.back().push_back(torch::zeros_like(p, dtype));
      exp_avg_sq_.back().push_back(torch::zeros_like(p, dtype));
    }
  }
}

void adamw_update(std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                  std::vector<torch::Tensor>& m, std::vector<torch::Tensor>& v, double lr, double weight_decay,
                  const OptimizerOptions& cfg, int64_t step) {
  if (params.empty()) return;
  const double bc1 = 1.0 - std::pow(cfg.betas[0], static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(cfg.betas[1], static_cast<double>(step));
  // Decoupled decay: shrink the weight itself, not the gradient.
  if (weight_decay != 0.0) at::_foreach_mul_(params, 1.0 - lr * weight_decay);
  at::_foreach_mul_(m, cfg.betas[0]);
  at::_foreach_add_(m, grads, 1.0 - cfg.betas[0]);
  at::_foreach_mul_(v, cfg.betas[1]);
  at::_foreach_addcmul_(v, grads, grads, 1.0 - cfg.betas[1]);
  auto denom = at::_foreach_sqrt(v);
  at::_foreach_div_(denom, std::sqrt(bc2));
  at::_foreach_add_(denom, cfg.eps);
  at::_foreach_addcdiv_(params, m, denom, -lr / bc1);
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++step_;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& g = groups_[gi];
    // The update runs in fp32 (or fp64); a bf16/fp16 parameter gets the result rounded once.
    std::vector<torch::Tensor> masters, grads, m, v, rounded;
    for (size_t pi = 0; pi < g.params.size(); ++pi) {
      auto p = g.params[pi];
      if (!p.grad().defined()) continue;
      const bool exact = p.scalar_type() == torch::kFloat || p.scalar_type() == torch::kDouble;
      masters.push_back(exact ? p : p.to(torch::kFloat));
      grads.push_back(p.grad().to(masters.back().scalar_type()));
      m.push_back(exp_avg_[gi][pi]);
      v.push_back(exp_avg_sq_[gi][pi]);
      rounded.push_back(exact ? torch::Tensor() : p);
    }
    adamw_update(masters, grads, m, v, lr, g.weight_decay, cfg_, step_);
    for (size_t k = 0; k < masters.size(); ++k)
      if (rounded[k].defined()) rounded[k].copy_(masters[k]);
  }
}

void AdamW::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params)
      if (p.grad().defined()) p.grad().zero_();
}

}  // namespace me::optim
