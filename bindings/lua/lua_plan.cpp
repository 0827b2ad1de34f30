// The layout planner from Lua (engine/plan/layout_search.h):
//   core.plan(recipe, opts)        -> `megaengine plan`'s report (a string)
//   core.plan_layout(recipe, opts) -> the best layout as recipe fields, for parallel.auto
// opts: nodes, gpus_per_node (both 0 or absent in a run: from the launch environment, RANK /
// WORLD_SIZE / LOCAL_WORLD_SIZE or Slurm's), gpu (a built-in profile's name), profile (a file),
// gpu_memory (overrides the profile's), top.
#include "bindings/lua/lua_recipe.h"
#include "bindings/lua/lua_util.h"
#include "bindings/lua/modules.h"
#include "engine/launch/bootstrap.h"
#include "engine/plan/layout_search.h"
#include "engine/plan/memory_report.h"

#include <cstdlib>

namespace me::lua {
namespace {

// The profile the options name: --profile FILE, else --gpu NAME, else ME_PLAN_GPU, else H100.
plan::DeviceProfile profile_of(lua_State* L) {
  const auto file = field_string(L, 2, "profile", "--profile", std::string());
  if (!file.empty()) return plan::load_profile_file(file);
  const char* env = std::getenv("ME_PLAN_GPU");
  return plan::builtin_profile(field_string(L, 2, "gpu", "--gpu", std::string(env && *env ? env : "h100-80gb")));
}

plan::PlanRequest request_of(lua_State* L, const config::Recipe& spec) {
  check_table(L, 2);
  plan::PlanRequest r;
  r.base = plan::memory_plan(spec, static_cast<int>(spec.parallel.tp * spec.parallel.pp));
  int nodes = static_cast<int>(field_integer(L, 2, "nodes", "--nodes", int64_t{0}));
  int per_node = static_cast<int>(field_integer(L, 2, "gpus_per_node", "--gpus-per-node", int64_t{0}));
  const int world = static_cast<int>(field_integer(L, 2, "world", "--world", int64_t{0}));
  if (nodes == 0 && per_node == 0 && world == 0) {  // a run: the job's own ranks
    const auto env = launch::read_launch_env();
    per_node = env.local_world;
    ME_CHECK(env.world % per_node == 0, "parallel.auto: the job's ", env.world, " ranks are not a whole number of nodes of ",
             per_node, " (LOCAL_WORLD_SIZE / Slurm's tasks per node): give every node the same number of ranks");
    nodes = env.world / per_node;
  } else if (world > 0) {  // the dry run's --world [--gpus-per-node]
    if (per_node == 0) per_node = 8;
    if (world < per_node) per_node = world;
    ME_CHECK(world % per_node == 0, "--world ", world, " is not a whole number of nodes of --gpus-per-node ", per_node);
    nodes = world / per_node;
  }
  r.nodes = nodes > 0 ? nodes : 1;
  r.gpus_per_node = per_node > 0 ? per_node : 8;
  r.profile = profile_of(L);
  const auto memory = field_string(L, 2, "gpu_memory", "--gpu-memory", std::string());
  if (!memory.empty()) r.gpu_bytes = plan::parse_memory_size(memory);
  return r;
}

int64_t samples_of(const config::Recipe& spec, const plan::MemoryPlan& p) {
  if (spec.train.samples > 0) return spec.train.samples;
  return spec.train.iters * p.global();
}

// core.plan(recipe, opts) -> report
int plan_report(lua_State* L) {
  check_table(L, 1);
  const auto spec = read_recipe(L, 1);
  config::validate(spec);
  const auto r = request_of(L, spec);
  const auto result = plan::search_layouts(r);
  if (result.fitting.empty()) plan::best_layout(r);  // throws: the largest term and what would fit
  const int top = static_cast<int>(field_integer(L, 2, "top", "--top", int64_t{5}));
  const auto report = plan::plan_report(r, result, top, samples_of(spec, result.fitting.front().plan));
  lua_pushlstring(L, report.data(), report.size());
  return 1;
}

// core.plan_layout(recipe, opts) -> {tp, pp, sequence_parallel, recompute, micro, global,
// distributed_optimizer, description, nodes, gpus_per_node, profile, step_s, memory_gb}
int plan_layout(lua_State* L) {
  check_table(L, 1);
  const auto spec = read_recipe(L, 1);
  const auto r = request_of(L, spec);
  const auto best = plan::best_layout(r);
  const auto& p = best.plan;
  lua_createtable(L, 0, 13);
  auto integer = [&](const char* k, int64_t v) { lua_pushinteger(L, v), lua_setfield(L, -2, k); };
  auto boolean = [&](const char* k, bool v) { lua_pushboolean(L, v), lua_setfield(L, -2, k); };
  auto text = [&](const char* k, const std::string& v) { lua_pushlstring(L, v.data(), v.size()), lua_setfield(L, -2, k); };
  integer("tp", p.tp);
  integer("pp", p.pp);
  boolean("sequence_parallel", p.sequence_parallel);
  text("recompute", p.model.recompute);
  integer("micro", p.micro_batch);
  integer("global", p.global());
  boolean("distributed_optimizer", p.distributed_optimizer);
  text("description", plan::describe_layout_choice(p));
  integer("nodes", r.nodes);
  integer("gpus_per_node", r.gpus_per_node);
  text("profile", r.profile.name);
  lua_pushnumber(L, best.time.total / 1e3), lua_setfield(L, -2, "step_s");
  lua_pushnumber(L, best.memory / 1e9), lua_setfield(L, -2, "memory_gb");
  return 1;
}

}  // namespace

void open_plan(lua_State* L, int core) {
  lua_pushcfunction(L, wrapped<plan_report>);
  lua_setfield(L, core, "plan");
  lua_pushcfunction(L, wrapped<plan_layout>);
  lua_setfield(L, core, "plan_layout");
}

}  // namespace me::lua
