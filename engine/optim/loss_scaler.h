// Dynamic loss scaling for fp16 training (Megatron's DynamicGradScaler): the loss is
// multiplied by `scale` before backward so small gradients survive fp16; gradients are divided
// by it before the update. An overflow (non-finite gradient norm) skips the step and, after
// `hysteresis` overflows, halves the scale; `growth_interval` clean steps in a row double it.
#pragma once
#include <cstdint>

namespace me::optim {

class LossScaler {
 public:
  explicit LossScaler(double initial = 65536.0, double min_scale = 1.0, int64_t growth_interval = 1000,
                      int64_t hysteresis = 2);
  double scale() const { return scale_; }
  // After each step: whether its gradients overflowed.
  void update(bool found_inf);

  // Everything a resumed run needs to scale as this one would have.
  struct State {
    double scale;
    int64_t good_steps, hysteresis_left;
  };
  State state() const { return {scale_, good_steps_, hysteresis_left_}; }
  void set_state(const State& s) {
    scale_ = s.scale;
    good_steps_ = s.good_steps;
    hysteresis_left_ = s.hysteresis_left;
  }

 private:
  double scale_, min_scale_;
  int64_t growth_interval_, hysteresis_;
  int64_t good_steps_ = 0, hysteresis_left_;
};

}  // namespace me::optim
