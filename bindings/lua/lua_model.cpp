// Models from Lua: validation and parameter counts of a model table (cheap, no weights), and
// building one, optionally split over a tensor-parallel group, into a module that can be
// printed, run forward and backward, and compared across layouts.
#include "bindings/lua/lua_model.h"

#include "bindings/lua/lua_recipe.h"
#include "bindings/lua/lua_tensor.h"
#include "bindings/lua/modules.h"
#include "engine/parallel/mappings.h"

namespace me::lua {

const char* const kModelMeta = "me.Model";

model::TransformerConfig read_model_config(lua_State* L, int t, const std::string& path) {
  model::TransformerConfig c;
  model::visit_fields(c, FieldReader(L, t, path));
  ME_CHECK(c.kind == "gpt" || c.kind == "llama", path, ".kind: unknown model '", c.kind, "' (gpt, llama)");
  c.validate(path);
  return c;
}

void push_model(lua_State* L, LuaModel m) { push_object<LuaModel>(L, kModelMeta, std::move(m)); }

namespace {

int model_check(lua_State* L) {
  check_table(L, 1);
  read_model_config(L, 1, lua_isstring(L, 2) ? lua_tostring(L, 2) : "model");
  return 0;
}

int model_parameters(lua_State* L) {  // core.model_parameters(spec [, tp])
  check_table(L, 1);
  const int tp = lua_isnoneornil(L, 2) ? 1 : static_cast<int>(check_integer(L, 2));
  lua_pushinteger(L, read_model_config(L, 1, "model").parameter_count(tp));
  return 1;
}

// core.build_model(spec [, seed | {seed=, tp=group, sequence_parallel=}])
int build_model(lua_State* L) {
  check_table(L, 1);
  auto cfg = read_model_config(L, 1, "model");
  uint64_t seed = 0;
  LuaModel m;
  parallel::TensorParallel tp;
  if (lua_type(L, 2) == LUA_TNUMBER) {
    seed = static_cast<uint64_t>(check_integer(L, 2));
  } else if (lua_type(L, 2) == LUA_TTABLE) {
    seed = static_cast<uint64_t>(field_integer(L, 2, "seed", "build", 0));
    tp.sequence_parallel = field_boolean(L, 2, "sequence_parallel", "build", false);
    if (lua_getfield(L, 2, "tp") != LUA_TNIL) {
      m.group = check_object<std::shared_ptr<comm::ProcessGroup>>(L, lua_gettop(L), "me.ProcessGroup",
                                                                  "process group (build{tp = grid.tp})");
      tp.group = m.group.get();
    }
    lua_pop(L, 1);
  } else if (!lua_isnoneornil(L, 2)) {  // :build() passes nil: seed 0, as documented
    arg_error(L, 2, "seed (integer) or build options table");
  }
  m.module = model::Transformer(cfg, tp, model::PipelineStage{}, /*initialize=*/false);
  m.module->reset_parameters(seed);
  push_model(L, std::move(m));
  return 1;
}

LuaModel& check_model(lua_State* L, int arg) { return check_object<LuaModel>(L, arg, kModelMeta, "model"); }

int model_tostring(lua_State* L) {
  lua_pushstring(L, model::describe_model(*check_model(L, 1).module).c_str());
  return 1;
}

int m_forward(lua_State* L) { push_tensor(L, check_model(L, 1).module->forward(check_tensor(L, 2))); return 1; }
int m_full_logits(lua_State* L) { push_tensor(L, check_model(L, 1).module->full_logits(check_tensor(L, 2))); return 1; }

int m_loss(lua_State* L) {
  push_tensor(L, check_model(L, 1).module->loss(check_tensor(L, 2), check_tensor(L, 3)));
  return 1;
}

int m_parameter_count(lua_State* L) {  // the full model's count; :local_parameter_count() this rank's
  auto& m = check_model(L, 1);
  lua_pushinteger(L, m.module->config().parameter_count(m.module->tensor_parallel().size()));
  return 1;
}

int m_local_parameter_count(lua_State* L) { lua_pushinteger(L, check_model(L, 1).module->local_parameter_count()); return 1; }

// name -> tensor: this rank's parameters (sharing storage), or their gradients, or either
// gathered to the full, unsplit shape (collective over the model's tensor-parallel group).
template <bool Grad, bool Full>
int m_params(lua_State* L) {
  auto& m = check_model(L, 1);
  lua_newtable(L);
  for (const auto& p : m.module->named_parameters()) {
    torch::Tensor t = Grad ? p.value().grad() : p.value().detach();
    if (!t.defined()) continue;
    const auto& info = m.module->shards().at(p.key());
    if (Full && m.group && m.group->size() > 1 && info.dim >= 0) t = parallel::all_gather_dim(t, info.dim, *m.group);
    push_tensor(L, t);
    lua_setfield(L, -2, p.key().c_str());
  }
  return 1;
}

int m_zero_grad(lua_State* L) {
  for (auto& p : check_model(L, 1).module->parameters())
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
  return 0;
}

int m_finalize_grads(lua_State* L) { check_model(L, 1).module->finalize_sequence_parallel_grads(); return 0; }

int m_to(lua_State* L) {
  check_model(L, 1).module->to(torch::Device(check_string(L, 2)));
  lua_settop(L, 1);
  return 1;
}

}  // namespace

void open_model(lua_State* L, int core) {
  static const luaL_Reg methods[] = {{"forward", wrapped<m_forward>}, {"full_logits", wrapped<m_full_logits>},
                                     {"loss", wrapped<m_loss>}, {"parameter_count", wrapped<m_parameter_count>},
                                     {"local_parameter_count", wrapped<m_local_parameter_count>},
                                     {"parameters", wrapped<m_params<false, false>>},
                                     {"parameters_full", wrapped<m_params<false, true>>},
                                     {"gradients", wrapped<m_params<true, false>>},
                                     {"gradients_full", wrapped<m_params<true, true>>},
                                     {"zero_grad", wrapped<m_zero_grad>}, {"finalize_grads", wrapped<m_finalize_grads>},
                                     {"to", wrapped<m_to>}, {nullptr, nullptr}};
  static const luaL_Reg metamethods[] = {{"__tostring", wrapped<model_tostring>}, {"__call", wrapped<m_forward>}, {nullptr, nullptr}};
  define_class<LuaModel>(L, kModelMeta, methods, metamethods);
  static const luaL_Reg fns[] = {{"model_check", wrapped<model_check>}, {"model_parameters", wrapped<model_parameters>},
                                 {"build_model", wrapped<build_model>}, {nullptr, nullptr}};
  lua_pushvalue(L, core);
  luaL_setfuncs(L, fns, 0);
  lua_pop(L, 1);
}

}  // namespace me::lua
