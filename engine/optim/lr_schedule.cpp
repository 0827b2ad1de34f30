#include "engine/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"

namespace me::optim {

double LRSchedule::lr(int64_t step) const {
  if (warmup > 0 && step <= warmup) return max_lr * static_cast<double>(step) / static_cast<double>(warmup);
  if (kind == Kind::constant) return max_lr;
  if (kind == Kind::inverse_sqrt) {
    const double w = static_cast<double>(std::max<int64_t>(warmup, 1));
    const double s = static_cast<double>(std::max<int64_t>(step, 1));
    return std::max(min_lr, max_lr * std::sqrt(w) / std::sqrt(s));
  }
  if (step > decay) return min_lr;
  const double delta = max_lr - min_lr;
  double coeff = 1.0;
  if (kind == Kind::wsd) {
    const int64_t anneal_start = decay - wsd_decay;
    if (step > anneal_start)
      coeff = 1.0 - static_cast<double>(step - anneal_start) / static_cast<double>(std::max<int64_t>(wsd_decay, 1));
  } else {
    const double ratio = static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(decay - warmup, 1));
    coeff = kind == Kind::linear ? 1.0 - ratio : 0.5 * (std::cos(M_PI * ratio) + 1.0);
  }
  return min_lr + coeff * delta;
}

void LRSchedule::validate() const {
  ME_CHECK(max_lr > 0, "optimizer.lr must be positive, got ", max_lr);
  ME_CHECK(min_lr >= 0 && min_lr <= max_lr, "schedule.min_lr must be in [0, optimizer.lr = ", max_lr, "], got ", min_lr);
  ME_CHECK(warmup >= 0, "schedule warmup must be >= 0, got ", warmup);
  if (kind != Kind::constant && kind != Kind::inverse_sqrt)
    ME_CHECK(decay > warmup, "schedule decay length (", decay, ") must exceed the warmup (", warmup,
             "): set schedule.decay_iters or train.iters");
  if (kind == Kind::wsd)
    ME_CHECK(wsd_decay > 0 && wsd_decay <= decay - warmup, "schedule.wsd_decay_iters must be in [1, ", decay - warmup,
             "], got ", wsd_decay);
}

LRSchedule::Kind LRSchedule::parse_kind(const std::string& name) {
  if (name == "constant") return Kind::constant;
  if (name == "linear") return Kind::linear;
  if (name == "cosine") return Kind::cosine;
  if (name == "inverse-square-root" || name == "inverse_sqrt") return Kind::inverse_sqrt;
  if (name == "wsd" || name == "warmup-stable-decay") return Kind::wsd;
  fail("unknown schedule '", name, "': expected constant, linear, cosine, inverse-square-root or wsd");
}

std::string LRSchedule::kind_name(Kind kind) {
  switch (kind) {
    case Kind::constant: return "constant";
    case Kind::linear: return "linear";
    case Kind::cosine: return "cosine";
    case Kind::inverse_sqrt: return "inverse-square-root";
    case Kind::wsd: return "wsd";
  }
  return "?";
}

}  // namespace me::optim
