// `megaengine --dry-run`'s report from Lua: core.dry_run(recipe, {world=, gpus_per_node=,
// gpu_memory=}) reads the resolved recipe (as the trainer does) and returns the layout table, parameter counts, memory estimate and
// verdict (engine/plan/memory_report.h), after the checks the run makes (config::validate,
// config::plan_steps). Shapes only: no weights, no data files.
#include "bindings/lua/lua_recipe.h"
#include "bindings/lua/lua_util.h"
#include "bindings/lua/modules.h"
#include "engine/plan/memory_report.h"
#include "engine/plan/step_time.h"

#include <cstdio>

namespace me::lua {
namespace {

std::string grouped(int64_t n) {  // 508627 -> "508,627"
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > (n < 0 ? 1 : 0); i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

// The run's length and batch as the trainer plans them (config::plan_steps, the same checks).
std::string steps_line(const config::Recipe& spec, int world) {
  const int64_t dp = world / (spec.parallel.tp * spec.parallel.pp);
  const auto p = config::plan_steps(spec, dp);
  std::string s = cat("iterations: ", grouped(p.iters));
  if (p.from_samples)
    s += cat(" (train.samples = ", grouped(spec.train.samples), " / global batch ", p.global,
             ", rounded up; train.iters is not used)");
  return s + cat(", global batch ", p.global, " = micro ", spec.batch.micro, " x ", dp, " data-parallel rank",
                 dp == 1 ? "" : "s", " x ", p.accumulation, " accumulation step", p.accumulation == 1 ? "" : "s", "\n");
}

// The planner's estimate for this layout (engine/plan/step_time.h), to set beside the run's
// "elapsed time per iteration", on the profile plan::select_profile picks.
std::string step_time_line(lua_State* L, const config::Recipe& spec, const plan::DryRunOptions& o) {
  std::string file, gpu;
  if (lua_istable(L, 2)) {
    file = field_string(L, 2, "profile", "--profile", std::string());
    gpu = field_string(L, 2, "gpu", "--gpu", std::string());
  }
  const auto profile = plan::select_profile(file, gpu);
  const auto t = plan::estimate_step_time(plan::memory_plan(spec, o.world), profile, o.gpus_per_node);
  char head[160];
  std::snprintf(head, sizeof head, "estimated step time on %s: %.3f s, %.0f tokens/s, MFU %.1f%%", profile.name.c_str(),
                t.total / 1e3, t.tokens_per_s, 100 * t.mfu);
  return cat(head, " (", profile.source.substr(0, profile.source.find(',')), "; megaengine plan ranks the other layouts)\n  ",
             plan::describe_terms(t), "\n");
}

// core.dry_run(recipe, opts) -> the report (a string)
int dry_run(lua_State* L) {
  check_table(L, 1);
  const auto spec = read_recipe(L, 1);  // the resolved recipe: every field is there
  config::validate(spec);                   // the run's own checks: what it refuses, the dry run refuses
  plan::DryRunOptions o;
  o.world = 0;
  std::string world_note;
  if (lua_istable(L, 2)) {
    o.world = static_cast<int>(field_integer(L, 2, "world", "--world", int64_t{0}));
    o.gpus_per_node = static_cast<int>(field_integer(L, 2, "gpus_per_node", "--gpus-per-node", int64_t{8}));
    o.gpu_bytes = plan::parse_memory_size(field_string(L, 2, "gpu_memory", "--gpu-memory", std::string("80GB")));
  }
  ME_CHECK(o.world >= 0, "--world needs a positive number of GPUs, got ", o.world);
  ME_CHECK(o.gpus_per_node >= 1, "--gpus-per-node needs a positive number, got ", o.gpus_per_node);
  if (o.world == 0) {  // not given: one copy of the model, the smallest world the layout fits
    o.world = static_cast<int>(spec.parallel.tp * spec.parallel.pp);
    world_note = cat("world: --world not given, so tp x pp = ", o.world, " GPU", o.world == 1 ? "" : "s",
                     " (one data-parallel replica); --world N for the cluster's GPUs\n");
  }
  auto report = plan::dry_run_report(spec, o);  // checks the world against the layout first
  if (!report.empty() && report.back() != '\n') report += '\n';
  report = world_note + steps_line(spec, o.world) + report + step_time_line(L, spec, o);
  lua_pushlstring(L, report.data(), report.size());
  return 1;
}

}  // namespace

void open_dry_run(lua_State* L, int core) {
  lua_pushcfunction(L, wrapped<dry_run>);
  lua_setfield(L, core, "dry_run");
}

}  // namespace me::lua
