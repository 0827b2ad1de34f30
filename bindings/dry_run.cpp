// `megaengine --dry-run`'s report from Lua: core.dry_run(recipe, {world=, gpus_per_node=,
// gpu_memory=}) reads the fields of a recipe table that shape the run (model, parallel, batch,
// precision, optimizer) and returns the layout table, parameter counts, memory estimate and
// verdict (engine/train/memory_report.h). Shapes only: no weights, no data files.
#include "bindings/lua_model.h"
#include "bindings/lua_util.h"
#include "bindings/modules.h"
#include "engine/train/memory_report.h"

namespace me::lua {
namespace {

void read_parallel(lua_State* L, int t, train::ParallelSpec& p) {
  p.tp = field_integer(L, t, "tp", "parallel", p.tp);
  p.pp = field_integer(L, t, "pp", "parallel", p.pp);
  p.pp_first_layers = field_integer(L, t, "pp_first_layers", "parallel", p.pp_first_layers);
  p.pp_last_layers = field_integer(L, t, "pp_last_layers", "parallel", p.pp_last_layers);
  p.pp_split = field_string(L, t, "pp_split", "parallel", p.pp_split);
  p.pp_deferred_wgrads = field_integer(L, t, "pp_deferred_wgrads", "parallel", p.pp_deferred_wgrads);
  p.sequence_parallel = field_boolean(L, t, "sequence_parallel", "parallel", p.sequence_parallel);
  p.distributed_optimizer = field_boolean(L, t, "distributed_optimizer", "parallel", p.distributed_optimizer);
  p.grad_accumulation_fusion = field_boolean(L, t, "grad_accumulation_fusion", "parallel", p.grad_accumulation_fusion);
  p.symmetric_buffers = field_string(L, t, "symmetric_buffers", "parallel", p.symmetric_buffers);
  p.grad_reduce_dtype = field_string(L, t, "grad_reduce_dtype", "parallel", p.grad_reduce_dtype);
  p.tp_symmetric_mb = field_number(L, t, "tp_symmetric_mb", "parallel", p.tp_symmetric_mb);
  ME_CHECK(p.tp >= 1 && p.pp >= 1, "parallel.tp and parallel.pp must be positive integers");
  ME_CHECK(p.pp_split == "even" || p.pp_split == "balanced", "parallel.pp_split must be \"even\" or \"balanced\", got '",
           p.pp_split, "'");
}

// The part of a RunSpec the memory estimate reads, from the recipe table at index r.
train::RunSpec read_shape_spec(lua_State* L, int r) {
  train::RunSpec s;
  s.device = field_string(L, r, "device", "recipe", s.device);
  s.precision = field_string(L, r, "precision", "recipe", s.precision);
  if (!push_field_table(L, r, "model", "recipe")) fail("recipe.model is missing: add model = me.model.gpt{...}");
  s.model = read_model_config(L, lua_gettop(L), "model");
  lua_pop(L, 1);
  if (push_field_table(L, r, "optimizer", "recipe")) {
    s.optim.kind = field_string(L, lua_gettop(L), "kind", "optimizer", s.optim.kind);
    lua_pop(L, 1);
  }
  if (push_field_table(L, r, "batch", "recipe")) {
    s.train.micro_batch = field_integer(L, lua_gettop(L), "micro", "batch", s.train.micro_batch);
    s.train.global_batch = field_integer(L, lua_gettop(L), "global", "batch", s.train.global_batch);
    lua_pop(L, 1);
  }
  if (push_field_table(L, r, "parallel", "recipe")) {
    read_parallel(L, lua_gettop(L), s.parallel);
    lua_pop(L, 1);
  }
  return s;
}

// core.dry_run(recipe, opts) -> the report (a string)
int dry_run(lua_State* L) {
  check_table(L, 1);
  const auto spec = read_shape_spec(L, 1);
  train::DryRunOptions o;
  o.world = 0;
  std::string world_note;
  if (lua_istable(L, 2)) {
    o.world = static_cast<int>(field_integer(L, 2, "world", "--world", int64_t{0}));
    o.gpus_per_node = static_cast<int>(field_integer(L, 2, "gpus_per_node", "--gpus-per-node", int64_t{8}));
    o.gpu_bytes = model::parse_memory_size(field_string(L, 2, "gpu_memory", "--gpu-memory", std::string("80GB")));
  }
  ME_CHECK(o.world >= 0, "--world needs a positive number of GPUs, got ", o.world);
  ME_CHECK(o.gpus_per_node >= 1, "--gpus-per-node needs a positive number, got ", o.gpus_per_node);
  if (o.world == 0) {  // not given: one copy of the model, the smallest world the layout fits
    o.world = static_cast<int>(spec.parallel.tp * spec.parallel.pp);
    world_note = cat("world: --world not given, so tp x pp = ", o.world, " GPU", o.world == 1 ? "" : "s",
                     " (one data-parallel replica); --world N for the cluster's GPUs\n");
  }
  const auto report = world_note + train::dry_run_report(spec, o);
  lua_pushlstring(L, report.data(), report.size());
  return 1;
}

}  // namespace

void open_dry_run(lua_State* L, int core) {
  lua_pushcfunction(L, wrapped<dry_run>);
  lua_setfield(L, core, "dry_run");
}

}  // namespace me::lua
