#include "engine/model/pipeline_stage.h"

#include <algorithm>

#include "engine/core/error.h"

namespace me::model {

std::vector<int64_t> PipelineStage::stage_layers(int64_t layers) const {
  ME_CHECK(first_layers >= 0 && last_layers >= 0, "parallel.pp_first_layers and pp_last_layers must be 0 (an even ",
           "share) or positive, got ", first_layers, " and ", last_layers);
  ME_CHECK(count > 1 || (first_layers == 0 && last_layers == 0),
           "parallel.pp_first_layers / pp_last_layers need pipeline parallelism (parallel.pp > 1)");
  const bool fixed_first = first_layers > 0, fixed_last = last_layers > 0;
  const int64_t even = count - fixed_first - fixed_last, rest = layers - first_layers - last_layers;
  if (!fixed_first && !fixed_last)
    ME_CHECK(layers % count == 0, "model.layers (", layers, ") is not divisible by parallel.pp (", count,
             "): choose a pp that divides ", layers, ", or give the first and last stages their own number of ",
             "layers (parallel.pp_first_layers, parallel.pp_last_layers)");
  else if (even == 0)
    ME_CHECK(rest == 0, "parallel.pp_first_layers (", first_layers, ") + pp_last_layers (", last_layers,
             ") must add up to model.layers (", layers, ") with ", count, " pipeline stages");
  else
    ME_CHECK(rest >= even && rest % even == 0, "model.layers (", layers, ") less the first and last stages' (",
             first_layers, " and ", last_layers, ") leaves ", rest, " layers, which the other ", even,
             " pipeline stages cannot share evenly (at least one each)");
  std::vector<int64_t> sizes(static_cast<size_t>(count), even > 0 ? rest / even : 0);
  if (fixed_first) sizes.front() = first_layers;
  if (fixed_last) sizes.back() = last_layers;
  return sizes;
}

std::pair<int64_t, int64_t> balanced_stage_split(const TransformerConfig& config, int stages, int tp) {
  const int64_t layers = config.layers, middle = stages - 2;
  // The output layer's work in layers (GPT 1.3B: 1.76, LLaMA 1B: 1.22); the embedding lookup is cheap.
  const double output = config.output_flops_per_token(tp) / config.layer_flops_per_token();
  std::pair<int64_t, int64_t> best{0, 0};
  double best_cost = 0;
  // m: each middle stage's layers (with two stages there are none: one pass).
  for (int64_t m = 1; m <= (middle > 0 ? layers : 1); ++m)
    for (int64_t last = 1; last <= (middle > 0 ? m : layers - 1); ++last) {
      const int64_t first = layers - middle * m - last;
      if (first < 1) continue;
      const double cost = std::max({static_cast<double>(first), middle > 0 ? static_cast<double>(m) : 0.0,
                                    static_cast<double>(last) + output});
      if (best.first == 0 || cost < best_cost) best = {first, last}, best_cost = cost;
    }
  return best;
}

std::pair<int64_t, int64_t> PipelineStage::layer_range(int64_t layers) const {
  const auto sizes = stage_layers(layers);
  int64_t start = 0;
  for (int i = 0; i < index; ++i) start += sizes[static_cast<size_t>(i)];
  return {start, sizes[static_cast<size_t>(index)]};
}

}  // namespace me::model
