// The layout planner from Lua (engine/plan/layout_search.h):
//   core.plan(recipe, opts)        -> `megaengine plan`'s report (a string)
//   core.plan_layout(recipe, opts) -> the best layout as recipe fields, for parallel.auto
// opts: nodes, gpus_per_node (both 0 or absent in a run: from the launch environment, RANK /
// WORLD_SIZE / LOCAL_WORLD_SIZE or Slurm's), gpu (a built-in profile's name), profile (a file),
// gpu_memory (overrides the profile's), top.
// For `megaengine plan --calibrate` (bindings/lua/calibrate.lua), seconds per call on a device:
//   core.plan_time_gemm(m, n, k, device), core.plan_time_attention(batch, heads, seq, head_dim,
//   device) (forward + backward), core.plan_time_add(elements, device) (out = a + b),
//   core.plan_write_profile(measured, path, base): the measured fields over a base profile, checked
//   as any profile is, written atomically.
#include "bindings/lua/lua_recipe.h"
#include "bindings/lua/lua_util.h"
#include "bindings/lua/modules.h"
#include "engine/launch/bootstrap.h"
#include "engine/plan/layout_search.h"
#include "engine/plan/memory_report.h"
#include "engine/core/torch_compat.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>

namespace me::lua {
namespace {

// The profile the options name (plan::select_profile: --profile, --gpu, ME_PLAN_GPU, H100).
plan::DeviceProfile profile_of(lua_State* L, int opts) {
  return plan::select_profile(field_string(L, opts, "profile", "--profile", std::string()),
                              field_string(L, opts, "gpu", "--gpu", std::string()));
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
  r.profile = profile_of(L, 2);
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

// ---- calibration ------------------------------------------------------------------------------

struct Timed {
  torch::Device device;
  torch::TensorOptions options;
  explicit Timed(const std::string& name)
      : device(name), options(torch::TensorOptions().device(device).dtype(device.is_cuda() ? torch::kBFloat16 : torch::kFloat32)) {}
  void sync() const {
    if (device.is_cuda()) compat::cuda_synchronize();
  }
  // Seconds per call: the best of 3 rounds of `iters` calls, after 2 warm-up calls.
  double seconds(int iters, const std::function<void()>& fn) const {
    fn(), fn(), sync();
    double best = 1e30;
    for (int round = 0; round < 3; ++round) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) fn();
      sync();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
    }
    return best;
  }
};

int iterations(lua_State* L, int arg) { return static_cast<int>(luaL_optinteger(L, arg, 10)); }

// core.plan_time_gemm(m, n, k, device [, iters]) -> seconds of [m x k] x [k x n]
int time_gemm(lua_State* L) {
  const auto m = check_integer(L, 1), n = check_integer(L, 2), k = check_integer(L, 3);
  const Timed t(check_string(L, 4));
  const auto a = torch::randn({m, k}, t.options), b = torch::randn({k, n}, t.options);
  lua_pushnumber(L, t.seconds(iterations(L, 5), [&] { a.matmul(b); }));
  return 1;
}

// core.plan_time_attention(batch, heads, seq, head_dim, device [, iters]) -> seconds of causal
// attention's forward and backward (the engine's own call: compat::causal_attention)
int time_attention(lua_State* L) {
  const auto b = check_integer(L, 1), h = check_integer(L, 2), s = check_integer(L, 3), d = check_integer(L, 4);
  const Timed t(check_string(L, 5));
  auto q = torch::randn({b, h, s, d}, t.options).requires_grad_(), k = torch::randn({b, h, s, d}, t.options).requires_grad_(),
       v = torch::randn({b, h, s, d}, t.options).requires_grad_();
  const auto grad = torch::randn({b, h, s, d}, t.options);
  lua_pushnumber(L, t.seconds(iterations(L, 6), [&] { compat::causal_attention(q, k, v).backward(grad); }));
  return 1;
}

// core.plan_time_add(elements, device [, iters]) -> seconds of out = a + b
int time_add(lua_State* L) {
  const auto n = check_integer(L, 1);
  const Timed t(check_string(L, 2));
  const auto a = torch::randn({n}, t.options), b = torch::randn({n}, t.options);
  auto out = torch::empty({n}, t.options);
  lua_pushnumber(L, t.seconds(iterations(L, 3), [&] { torch::add_out(out, a, b); }));
  return 1;
}

plan::Curve read_curve(lua_State* L, int t, const char* field) {
  plan::Curve c;
  lua_getfield(L, t, field);
  if (lua_istable(L, -1))
    for (lua_Integer i = 1; lua_rawgeti(L, -1, i) == LUA_TTABLE; ++i) {
      lua_rawgeti(L, -1, 1), lua_rawgeti(L, -2, 2);
      c.points.emplace_back(lua_tonumber(L, -2), lua_tonumber(L, -1));
      lua_pop(L, 3);
    }
  lua_settop(L, t);
  return c;
}

// core.plan_write_profile(measured, path, base): measured = {name, gpu, source, matmul_tflops,
// gemm_efficiency, attention_tflops, memory_gbps [, memory_gb] [, intra_node = {all_gather_gbps,
// ...}]}; what it lacks comes from `base` (a built-in name or a file).
int write_profile(lua_State* L) {
  check_table(L, 1);
  const auto path = check_string(L, 2), base_name = check_string(L, 3);
  const bool file = base_name.find('/') != std::string::npos || base_name.find(".json") != std::string::npos;
  auto p = plan::select_profile(file ? base_name : std::string(), file ? std::string() : base_name);
  p.name = field_string(L, 1, "name", "profile.name");
  p.gpu = field_string(L, 1, "gpu", "profile.gpu");
  p.source = field_string(L, 1, "source", "profile.source");
  p.matmul_tflops = field_number(L, 1, "matmul_tflops", "profile.matmul_tflops");
  p.memory_gbps = field_number(L, 1, "memory_gbps", "profile.memory_gbps");
  p.memory_bytes = field_number(L, 1, "memory_gb", "profile.memory_gb", p.memory_bytes / 1e9) * 1e9;
  p.gemm_efficiency = read_curve(L, 1, "gemm_efficiency");
  p.attention_tflops = read_curve(L, 1, "attention_tflops");
  if (push_field_table(L, 1, "intra_node", "profile")) {
    const int link = lua_gettop(L);
    p.intra_node.all_gather = read_curve(L, link, "all_gather_gbps");
    p.intra_node.reduce_scatter = read_curve(L, link, "reduce_scatter_gbps");
    p.intra_node.all_reduce = read_curve(L, link, "all_reduce_gbps");
    p.intra_node.send_recv = read_curve(L, link, "send_recv_gbps");
    p.intra_node.latency_us = field_number(L, link, "latency_us", "profile.intra_node.latency_us");
    lua_pop(L, 1);
  }
  const auto text = plan::profile_to_json(p);
  plan::parse_profile(text, "the measured profile");  // the checks any profile gets
  const auto tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    ME_CHECK(out.good(), "cannot write the profile to '", tmp, "'");
  }
  ME_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '", path, "'");
  return 0;
}

}  // namespace

void open_plan(lua_State* L, int core) {
  static const luaL_Reg fns[] = {{"plan_time_gemm", wrapped<time_gemm>},
                                 {"plan_time_attention", wrapped<time_attention>},
                                 {"plan_time_add", wrapped<time_add>},
                                 {"plan_write_profile", wrapped<write_profile>},
                                 {nullptr, nullptr}};
  for (const auto* f = fns; f->name; ++f) {
    lua_pushcfunction(L, f->func);
    lua_setfield(L, core, f->name);
  }
  lua_pushcfunction(L, wrapped<plan_report>);
  lua_setfield(L, core, "plan");
  lua_pushcfunction(L, wrapped<plan_layout>);
  lua_setfield(L, core, "plan_layout");
}

}  // namespace me::lua
