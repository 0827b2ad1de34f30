// Models from Lua: validation and parameter counts of a model table (cheap, no weights), and
// building one into a module that can be printed, run forward and sampled from.
#include "bindings/lua_model.h"

#include "bindings/lua_tensor.h"
#include "bindings/modules.h"
#include "engine/model/gpt.h"

namespace me::lua {

const char* const kModelMeta = "me.Model";

model::GPTConfig read_gpt_config(lua_State* L, int t, const std::string& path) {
  const std::string kind = field_string(L, t, "kind", path, std::string("gpt"));
  ME_CHECK(kind == "gpt", path, ".kind: model '", kind, "' is not available yet (gpt)");
  model::GPTConfig c;
  c.vocab = field_integer(L, t, "vocab", path, c.vocab);
  c.seq = field_integer(L, t, "seq", path, c.seq);
  c.layers = field_integer(L, t, "layers", path, c.layers);
  c.hidden = field_integer(L, t, "hidden", path, c.hidden);
  c.heads = field_integer(L, t, "heads", path, c.heads);
  c.ffn_hidden = field_integer(L, t, "ffn_hidden", path, c.ffn_hidden);
  c.init_std = field_number(L, t, "init_std", path, c.init_std);
  c.tie_embeddings = field_boolean(L, t, "tie_embeddings", path, c.tie_embeddings);
  c.validate(path);
  return c;
}

namespace {

int gpt_check(lua_State* L) {
  check_table(L, 1);
  read_gpt_config(L, 1, lua_isstring(L, 2) ? lua_tostring(L, 2) : "model");
  return 0;
}

int gpt_parameters(lua_State* L) {
  check_table(L, 1);
  lua_pushinteger(L, read_gpt_config(L, 1, "model").parameter_count());
  return 1;
}

int build_model(lua_State* L) {
  check_table(L, 1);
  const auto cfg = read_gpt_config(L, 1, "model");
  model::GPT gpt(cfg);
  if (lua_type(L, 2) == LUA_TNUMBER) gpt->reset_parameters(static_cast<uint64_t>(check_integer(L, 2)));
  push_object<model::GPT>(L, kModelMeta, std::move(gpt));
  return 1;
}

model::GPT& check_model(lua_State* L, int arg) { return check_object<model::GPT>(L, arg, kModelMeta, "model"); }

int m_tostring(lua_State* L) {
  auto& m = check_model(L, 1);
  lua_pushstring(L, (m->config().describe() + "\n" + model::describe_module(*m)).c_str());
  return 1;
}

int m_forward(lua_State* L) { push_tensor(L, check_model(L, 1)->forward(check_tensor(L, 2))); return 1; }

int m_loss(lua_State* L) {
  push_tensor(L, check_model(L, 1)->loss(check_tensor(L, 2), check_tensor(L, 3)));
  return 1;
}

int m_parameter_count(lua_State* L) { lua_pushinteger(L, check_model(L, 1)->parameter_count()); return 1; }

int m_parameters(lua_State* L) {  // name -> tensor (shares storage with the model)
  auto& m = check_model(L, 1);
  lua_newtable(L);
  for (const auto& p : m->named_parameters()) {
    push_tensor(L, p.value());
    lua_setfield(L, -2, p.key().c_str());
  }
  return 1;
}

int m_to(lua_State* L) {
  auto& m = check_model(L, 1);
  const auto dev = check_string(L, 2);
  m->to(torch::Device(dev));
  lua_settop(L, 1);
  return 1;
}

}  // namespace

void open_model(lua_State* L, int core) {
  static const luaL_Reg methods[] = {{"forward", wrapped<m_forward>}, {"loss", wrapped<m_loss>},
                                     {"parameter_count", wrapped<m_parameter_count>},
                                     {"parameters", wrapped<m_parameters>}, {"to", wrapped<m_to>}, {nullptr, nullptr}};
  static const luaL_Reg metamethods[] = {{"__tostring", wrapped<m_tostring>}, {"__call", wrapped<m_forward>}, {nullptr, nullptr}};
  define_class<model::GPT>(L, kModelMeta, methods, metamethods);
  static const luaL_Reg fns[] = {{"gpt_check", wrapped<gpt_check>}, {"gpt_parameters", wrapped<gpt_parameters>},
                                 {"build_model", wrapped<build_model>}, {nullptr, nullptr}};
  lua_pushvalue(L, core);
  luaL_setfuncs(L, fns, 0);
  lua_pop(L, 1);
}

}  // namespace me::lua
