// Training from Lua: a recipe table becomes a config::Recipe (config is data), then a Trainer that
// Lua can step, run, evaluate and sample from. Lua hooks (`on_log`) are called from the loop.
#include <torch/torch.h>

#include "bindings/lua/lua_model.h"
#include "bindings/lua/lua_recipe.h"
#include "bindings/lua/lua_tensor.h"
#include "bindings/lua/modules.h"
#include "engine/core/log.h"
#include "engine/train/trainer.h"

namespace me::lua {
namespace {

const char* const kTrainerMeta = "me.Trainer";

struct LuaTrainer {
  std::unique_ptr<train::Trainer> trainer;
  lua_State* owner = nullptr;
  int hook_ref = LUA_NOREF;
  ~LuaTrainer() {
    if (owner && hook_ref != LUA_NOREF) luaL_unref(owner, LUA_REGISTRYINDEX, hook_ref);
  }
};

void push_record(lua_State* L, const train::LogRecord& rec) {
  lua_createtable(L, 0, 10);
  auto set_i = [&](const char* k, int64_t v) { lua_pushinteger(L, v); lua_setfield(L, -2, k); };
  auto set_n = [&](const char* k, double v) { lua_pushnumber(L, v); lua_setfield(L, -2, k); };
  set_i("iteration", rec.iteration);
  set_i("iters", rec.iters);
  set_i("consumed_samples", rec.consumed_samples);
  set_n("lr", rec.lr);
  set_n("loss", rec.loss);
  set_n("grad_norm", rec.grad_norm);
  set_n("ms_per_iter", rec.ms_per_iter);
  set_n("tokens_per_s", rec.tokens_per_s);
  set_n("tflops_per_gpu", rec.tflops_per_gpu);
  set_n("mfu", rec.mfu);
  if (rec.phases.any()) {  // train.profile_phases: { data =, forward =, ... } ms per iteration
    lua_createtable(L, 0, train::kPhaseCount);
    for (int i = 0; i < train::kPhaseCount; ++i) {
      lua_pushnumber(L, rec.phases.ms[i]);
      lua_setfield(L, -2, train::kPhaseNames[i]);
    }
    lua_setfield(L, -2, "phases");
  }
  set_i("global_batch", rec.global_batch);
  set_i("skipped", rec.skipped);
  if (rec.val_loss >= 0) set_n("val_loss", rec.val_loss);
}

int new_trainer(lua_State* L) {
  check_table(L, 1);
  lua_settop(L, 1);
  auto spec = read_recipe(L, 1);
  apply_log_spec(spec.log);
  auto* lt = push_object<LuaTrainer>(L, kTrainerMeta);
  lt->owner = L;
  lua_getfield(L, 1, "on_log");
  if (lua_isfunction(L, -1)) lt->hook_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  else lua_pop(L, 1);
  lt->trainer = std::make_unique<train::Trainer>(std::move(spec));
  return 1;
}

LuaTrainer& check_trainer(lua_State* L, int arg) { return check_object<LuaTrainer>(L, arg, kTrainerMeta, "trainer"); }

// Hooks run on the thread that called step/run (a coroutine in the REPL, say).
void attach_hook(lua_State* L, LuaTrainer& lt) {
  if (lt.hook_ref == LUA_NOREF) return;
  const int ref = lt.hook_ref;
  lt.trainer->set_on_log([L, ref](const train::LogRecord& rec) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    push_record(L, rec);
    protected_call(L, 1, 0);
  });
}

int tr_step(lua_State* L) {
  auto& lt = check_trainer(L, 1);
  const auto r = lt.trainer->step();
  lua_createtable(L, 0, 6);
  lua_pushinteger(L, r.iteration); lua_setfield(L, -2, "iteration");
  lua_pushnumber(L, r.loss); lua_setfield(L, -2, "loss");
  lua_pushnumber(L, r.grad_norm); lua_setfield(L, -2, "grad_norm");
  lua_pushnumber(L, r.lr); lua_setfield(L, -2, "lr");
  lua_pushnumber(L, r.ms); lua_setfield(L, -2, "ms");
  lua_pushboolean(L, r.skipped); lua_setfield(L, -2, "skipped");
  return 1;
}

int tr_run(lua_State* L) {
  auto& lt = check_trainer(L, 1);
  attach_hook(L, lt);
  const auto s = lt.trainer->run();
  lua_createtable(L, 0, 7);
  lua_pushinteger(L, s.iterations); lua_setfield(L, -2, "iterations");
  lua_pushnumber(L, s.first_loss); lua_setfield(L, -2, "first_loss");
  lua_pushnumber(L, s.last_loss); lua_setfield(L, -2, "last_loss");
  if (s.val_loss >= 0) { lua_pushnumber(L, s.val_loss); lua_setfield(L, -2, "val_loss"); }
  lua_pushnumber(L, s.tokens_per_s); lua_setfield(L, -2, "tokens_per_s");
  lua_pushinteger(L, s.skipped); lua_setfield(L, -2, "skipped");
  lua_pushinteger(L, s.exit_status); lua_setfield(L, -2, "exit_status");
  if (!s.stopped.empty()) { lua_pushstring(L, s.stopped.c_str()); lua_setfield(L, -2, "stopped"); }
  lua_pushstring(L, s.sample.c_str()); lua_setfield(L, -2, "sample");
  lua_createtable(L, static_cast<int>(s.losses.size()), 0);
  for (size_t i = 0; i < s.losses.size(); ++i) {
    lua_pushnumber(L, s.losses[i]);
    lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
  }
  lua_setfield(L, -2, "losses");
  return 1;
}

int tr_evaluate(lua_State* L) { lua_pushnumber(L, check_trainer(L, 1).trainer->evaluate()); return 1; }

// t:sample{prompt=, tokens=, top_k=, temperature=} or t:sample(prompt): the fields the recipe's
// `sample` section has, each defaulting to the recipe's value.
int tr_sample(lua_State* L) {
  auto& lt = check_trainer(L, 1);
  auto sp = lt.trainer->spec().sample;
  if (lua_type(L, 2) == LUA_TTABLE) {
    lua_settop(L, 2);
    config::visit_fields(sp, [&](const char* name, auto& value) {
      if (lua_getfield(L, 2, name) != LUA_TNIL) FieldReader(L, 2, "sample")(name, value);
      lua_pop(L, 1);
    });
  } else if (!lua_isnoneornil(L, 2)) {
    sp.prompt = check_string(L, 2);
  }
  ME_CHECK(sp.tokens > 0, "trainer:sample: how many tokens? give tokens = N (the recipe's sample.tokens is ",
           sp.tokens, ")");
  ME_CHECK(sp.top_k >= 1 && sp.temperature > 0, "trainer:sample: top_k must be >= 1 and temperature > 0");
  lua_pushstring(L, lt.trainer->sample(sp.prompt, sp.tokens, sp.top_k, sp.temperature).c_str());
  return 1;
}

// t:save(dir): a checkpoint of this moment, written now (every rank calls it together).
int tr_save(lua_State* L) {
  check_trainer(L, 1).trainer->save(check_string(L, 2));
  return 0;
}

// t:load(path): a checkpoint directory (its latest) or an iter_N directory, of any layout.
int tr_load(lua_State* L) {
  check_trainer(L, 1).trainer->load(check_string(L, 2));
  return 0;
}

int tr_iteration(lua_State* L) { lua_pushinteger(L, check_trainer(L, 1).trainer->iteration()); return 1; }

int tr_model(lua_State* L) {
  auto& lt = check_trainer(L, 1);
  push_model(L, LuaModel{lt.trainer->model(), nullptr});  // shares the module
  return 1;
}

int tr_tostring(lua_State* L) {
  auto& lt = check_trainer(L, 1);
  const auto& s = lt.trainer->spec();
  lua_pushstring(L, cat("Trainer(", s.name, ": ", s.model.describe(), ", iteration ", lt.trainer->iteration(), "/",
                        lt.trainer->iters(), ", global batch ", lt.trainer->global_batch(), ", device ", s.device, ")").c_str());
  return 1;
}

}  // namespace

void open_train(lua_State* L, int core) {
  static const luaL_Reg methods[] = {{"step", wrapped<tr_step>}, {"run", wrapped<tr_run>},
                                     {"evaluate", wrapped<tr_evaluate>}, {"sample", wrapped<tr_sample>},
                                     {"iteration", wrapped<tr_iteration>}, {"model", wrapped<tr_model>},
                                     {"save", wrapped<tr_save>}, {"load", wrapped<tr_load>},
                                     {nullptr, nullptr}};
  static const luaL_Reg metamethods[] = {{"__tostring", wrapped<tr_tostring>}, {nullptr, nullptr}};
  define_class<LuaTrainer>(L, kTrainerMeta, methods, metamethods);
  lua_pushvalue(L, core);
  lua_pushcfunction(L, wrapped<new_trainer>);
  lua_setfield(L, -2, "trainer");
  lua_pop(L, 1);
}

}  // namespace me::lua
