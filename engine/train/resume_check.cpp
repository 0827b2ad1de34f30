#include "engine/train/resume_check.h"

#include <iomanip>
#include <set>
#include <sstream>
#include <utility>

#include "engine/core/error.h"

namespace me::train {

namespace {

// Every compared field of a config: its exact text (for comparing) and its shown text.
struct Collect {
  std::vector<std::string> names, exact, shown;
  template <class T>
  void operator()(const char* name, const T& v) {
    static const std::set<std::string> kSkipped = {"recompute",          "recompute_every", "init_std",
                                                   "vocab_divisible_by", "ffn_multiplier",  "ffn_multiple_of"};
    if (kSkipped.count(name)) return;
    std::ostringstream e, s;
    e << std::boolalpha << std::setprecision(17) << v;
    s << std::boolalpha << v;
    names.push_back(name);
    exact.push_back(e.str());
    shown.push_back(s.str());
  }
};

// ffn_hidden and query_groups compared as resolved (0 means the family's rule; the multiplier
// and multiple_of only enter through ffn_hidden).
Collect collect(model::TransformerConfig c) {
  c.ffn_hidden = c.ffn();
  c.query_groups = c.groups();
  Collect out;
  model::visit_fields(c, out);
  return out;
}

}  // namespace

std::vector<std::string> model_differences(const model::TransformerConfig& recipe, const model::TransformerConfig& saved) {
  const auto a = collect(recipe), b = collect(saved);
  std::vector<std::string> out;
  const bool rope = recipe.position == "rope" || saved.position == "rope";
  for (size_t i = 0; i < a.names.size(); ++i)
    if (a.exact[i] != b.exact[i] && (rope || a.names[i] != "rope_base"))  // rope_base is unused without RoPE
      out.push_back(cat("model.", a.names[i], ": ", a.shown[i], " in the recipe, ", b.shown[i], " in the checkpoint"));
  return out;
}

optim::LRSchedule saved_schedule(const config::Recipe& saved, int64_t saved_dp) {
  const auto& b = saved.batch;
  const int64_t global = b.global > 0 ? b.global : b.micro * saved_dp;
  const auto& t = saved.train;
  const int64_t iters = t.samples > 0 && global > 0 ? (t.samples + global - 1) / global : t.iters;
  return saved.schedule.resolve(saved.optim.lr, iters, global);
}

std::vector<std::string> schedule_differences(const optim::LRSchedule& recipe, const optim::LRSchedule& saved) {
  std::vector<std::string> out;
  auto term = [&](const char* what, const auto& now, const auto& then) {
    if (now == then) return;
    std::ostringstream s;
    s << what << ": " << then << " in the checkpoint's run, " << now << " in this recipe";
    out.push_back(s.str());
  };
  term("kind", optim::LRSchedule::kind_name(recipe.kind), optim::LRSchedule::kind_name(saved.kind));
  term("peak learning rate (optimizer.lr)", recipe.max_lr, saved.max_lr);
  term("minimum learning rate (schedule.min_lr)", recipe.min_lr, saved.min_lr);
  term("warm-up length", recipe.warmup, saved.warmup);
  term("end of the decay (schedule.decay_iters, else train.iters)", recipe.decay, saved.decay);
  term("WSD anneal length", recipe.wsd_decay, saved.wsd_decay);
  return out;
}

}  // namespace me::train
