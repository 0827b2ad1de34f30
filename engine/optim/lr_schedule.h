// Learning-rate schedules as Megatron's OptimizerParamScheduler defines them. Unit-agnostic:
// `step` is iterations or consumed samples, whichever the recipe counts in.
#pragma once
#include <cstdint>
#include <string>

namespace me::optim {

struct LRSchedule {
  enum class Kind { constant, linear, cosine, inverse_sqrt, wsd };

  Kind kind = Kind::cosine;
  double max_lr = 1e-3;
  double min_lr = 0.0;
  int64_t warmup = 0;        // linear ramp 0 -> max_lr over this many steps
  int64_t decay = 0;         // step at which decay ends (then min_lr); counts from 0, includes warmup
  int64_t wsd_decay = 0;     // warmup-stable-decay: length of the final (linear) anneal
  // The learning rate to use for step `step` (1 = the first optimizer step).
  double lr(int64_t step) const;

  void validate() const;  // throws me::Error naming the field
  static Kind parse_kind(const std::string& name);
  static std::string kind_name(Kind kind);
};

}  // namespace me::optim
