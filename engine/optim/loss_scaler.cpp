#include "engine/optim/loss_scaler.h"

#include <algorithm>

#include "engine/core/error.h"

namespace me::optim {

LossScaler::LossScaler(double initial, double min_scale, int64_t growth_interval, int64_t hysteresis)
    : scale_(initial), min_scale_(min_scale), growth_interval_(growth_interval), hysteresis_(hysteresis),
      hysteresis_left_(hysteresis) {
  ME_CHECK(initial > 0 && min_scale > 0 && growth_interval > 0 && hysteresis > 0,
           "loss scaler: initial, min scale, growth interval and hysteresis must be positive");
}

void LossScaler::update(bool found_inf) {
  if (found_inf) {
    good_steps_ = 0;
    if (--hysteresis_left_ <= 0) scale_ = std::max(scale_ * 0.5, min_scale_);
    return;
  }
  if (++good_steps_ == growth_interval_) {
    good_steps_ = 0;
    hysteresis_left_ = hysteresis_;
    scale_ *= 2.0;
  }
}

}  // namespace me::optim
