#include "engine/optim/adamw.h"

#include <cmath>

#include "engine/core/error.h"

namespace me::optim {

void AdamWConfig::validate() const {
  ME_CHECK(beta1 >= 0 && beta1 < 1, "optimizer.betas[1] must be in [0, 1), got ", beta1);
  ME_CHECK(beta2 >= 0 && beta2 < 1, "optimizer.betas[2] must be in [0, 1), got ", beta2);
  ME_CHECK(eps > 0, "optimizer.eps must be positive, got ", eps);
  ME_CHECK(weight_decay >= 0, "optimizer.weight_decay must be >= 0, got ", weight_decay);
}

std::vector<ParamGroup> decay_groups(const std::vector<torch::Tensor>& params, double weight_decay) {
  ParamGroup decay{{}, weight_decay}, no_decay{{}, 0.0};
  for (const auto& p : params) (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  return {decay, no_decay};
}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWConfig cfg) : groups_(std::move(groups)), cfg_(cfg) {
  cfg_.validate();
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

void adamw_update(torch::Tensor& p, const torch::Tensor& grad, torch::Tensor& m, torch::Tensor& v, double lr,
                  double weight_decay, const AdamWConfig& cfg, int64_t step) {
  const double bc1 = 1.0 - std::pow(cfg.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(cfg.beta2, static_cast<double>(step));
  // Decoupled decay: shrink the weight itself, not the gradient.
  if (weight_decay != 0.0) p.mul_(1.0 - lr * weight_decay);
  m.mul_(cfg.beta1).add_(grad, 1.0 - cfg.beta1);
  v.mul_(cfg.beta2).addcmul_(grad, grad, 1.0 - cfg.beta2);
  auto denom = (v.sqrt() / std::sqrt(bc2)).add_(cfg.eps);
  p.addcdiv_(m, denom, -lr / bc1);
}

void AdamW::step(double lr) {
  torch::NoGradGuard no_grad;
  ++step_;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& g = groups_[gi];
    for (size_t pi = 0; pi < g.params.size(); ++pi) {
      auto p = g.params[pi];
      if (!p.grad().defined()) continue;
      // The update runs in fp32 (or fp64); a bf16/fp16 parameter gets the result rounded once.
      const bool exact = p.scalar_type() == torch::kFloat || p.scalar_type() == torch::kDouble;
      auto master = exact ? p : p.to(torch::kFloat);
      adamw_update(master, p.grad().to(master.scalar_type()), exp_avg_[gi][pi], exp_avg_sq_[gi][pi], lr,
                   g.weight_decay, cfg_, step_);
      if (!exact) p.copy_(master);
    }
  }
}

void AdamW::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params)
      if (p.grad().defined()) p.grad().zero_();
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  for (const auto& p : params)
    if (p.grad().defined()) norms.push_back(p.grad().to(torch::kFloat).norm(2));
  if (norms.empty()) return 0.0;
  const double total = torch::stack(norms).norm(2).item<double>();
  if (max_norm > 0 && std::isfinite(total)) {
    const double coeff = max_norm / (total + 1e-6);
    if (coeff < 1.0)
      for (const auto& p : params)
        if (p.grad().defined()) p.grad().mul_(coeff);
  }
  return total;
}

}  // namespace me::optim
