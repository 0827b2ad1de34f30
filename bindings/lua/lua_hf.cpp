// me.hf: Hugging Face transformers from Lua. core.hf.export_dir(checkpoint, out [, opts]),
// core.hf.export_saved(save, out [, opts]) (a trainer: `save(dir)` writes a checkpoint on every
// rank, rank 0 exports it and removes it), core.hf.import(hf_dir, out [, model]) and
// core.hf.config(model [, dtype]), core.hf.save_tensors(path, tensors); bindings/lua/megaengine.lua
// wraps them as me.hf.*.
#include <cstdlib>

#include "bindings/lua/lua_model.h"
#include "bindings/lua/lua_tensor.h"
#include "bindings/lua/modules.h"
#include "engine/hf/convert.h"
#include "engine/launch/bootstrap.h"
#include "engine/core/files.h"

namespace me::lua {
namespace {



// opts = { dtype = "bf16", max_shard_size = bytes, force = true }
hf::ExportOptions export_options(lua_State* L, int arg) {
  hf::ExportOptions o;
  if (lua_isnoneornil(L, arg)) return o;
  check_table(L, arg);
  o.dtype = field_string(L, arg, "dtype", "me.hf.export options", std::string());
  const auto max = field_integer(L, arg, "max_shard_size", "me.hf.export options", 0);
  if (max > 0) o.max_shard_bytes = static_cast<uint64_t>(max);
  o.overwrite = field_boolean(L, arg, "force", "me.hf.export options", false);
  return o;
}

void push_result(lua_State* L, const hf::ExportResult& r) {
  lua_createtable(L, 0, 7);
  auto set_s = [&](const char* k, const std::string& v) { lua_pushstring(L, v.c_str()); lua_setfield(L, -2, k); };
  auto set_list = [&](const char* k, const std::vector<std::string>& v) {
    lua_createtable(L, static_cast<int>(v.size()), 0);
    for (size_t i = 0; i < v.size(); ++i) {
      lua_pushstring(L, v[i].c_str());
      lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
    }
    lua_setfield(L, -2, k);
  };
  set_s("dir", r.dir);
  set_s("family", r.family);
  set_s("dtype", r.dtype);
  set_list("files", r.files);
  set_list("notes", r.notes);
  lua_pushinteger(L, r.tensors);
  lua_setfield(L, -2, "tensors");
  lua_pushinteger(L, static_cast<lua_Integer>(r.weight_bytes));
  lua_setfield(L, -2, "bytes");
}

int export_dir(lua_State* L) {
  const auto r = hf::export_hf(check_string(L, 1), check_string(L, 2), export_options(L, 3));
  push_result(L, r);
  return 1;
}

// A trainer of any layout: saved as a checkpoint next to `out`, exported by rank 0, removed.
int export_saved(lua_State* L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  std::string out = check_string(L, 2);
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  const auto options = export_options(L, 3);
  const bool rank0 = launch::read_launch_env().rank == 0;
  const std::string tmp = out + ".checkpoint-tmp";
  if (rank0) files::remove_tree(tmp);  // a leftover: the save starts with a collective, so before any rank writes
  lua_pushvalue(L, 1);
  lua_pushstring(L, tmp.c_str());
  protected_call(L, 1, 0);
  if (!rank0) return 0;
  try {
    const auto r = hf::export_hf(tmp, out, options);
    files::remove_tree(tmp);
    push_result(L, r);
  } catch (...) {
    files::remove_tree(tmp);
    throw;
  }
  return 1;
}

// core.hf.import(hf_dir, out [, model]): the iteration directory written; a model table is
// checked against config.json first.
int import_dir(lua_State* L) {
  const std::string dir = check_string(L, 1), out = check_string(L, 2);
  if (lua_isnoneornil(L, 3)) {
    lua_pushstring(L, hf::import_hf(dir, out).iteration_dir.c_str());
  } else {
    check_table(L, 3);
    const auto expected = read_model_config(L, 3, "model");
    lua_pushstring(L, hf::import_hf(dir, expected, out).c_str());
  }
  return 1;
}

// core.hf.config(model [, dtype]): config.json (text) of a model table or a built model.
int config(lua_State* L) {
  model::TransformerConfig c;
  if (auto* m = test_object<LuaModel>(L, 1, kModelMeta)) {
    c = m->module->config();
  } else {
    check_table(L, 1);
    c = read_model_config(L, 1, "model");
  }
  const std::string dtype = lua_isnoneornil(L, 2) ? "float32" : check_string(L, 2);
  lua_pushstring(L, hf::config_json(c, dtype, -1, -1).c_str());
  return 1;
}

// core.hf.save_tensors(path, {name = tensor, ...}): a safetensors file of the tensors as they are
// (for comparisons with Python: safetensors.torch.load_file reads it).
int save_tensors(lua_State* L) {
  const auto path = check_string(L, 1);
  check_table(L, 2);
  std::vector<torch::Tensor> keep;
  std::vector<checkpoint::TensorSource> sources;
  lua_pushnil(L);
  while (lua_next(L, 2) != 0) {
    ME_CHECK(lua_type(L, -2) == LUA_TSTRING, "save_tensors: the table's keys must be tensor names");
    keep.push_back(check_tensor(L, lua_gettop(L)).detach().to(torch::kCPU).contiguous());
    sources.push_back({lua_tostring(L, -2), checkpoint::dtype_of(keep.back().scalar_type()), keep.back().sizes().vec(),
                       keep.back().data_ptr()});
    lua_pop(L, 1);
  }
  checkpoint::write_safetensors(path, sources, {{"format", "pt"}});
  return 0;
}

}  // namespace

void open_hf(lua_State* L, int core) {
  static const luaL_Reg fns[] = {{"export_dir", wrapped<export_dir>}, {"export_saved", wrapped<export_saved>},
                                 {"import", wrapped<import_dir>}, {"config", wrapped<config>},
                                 {"save_tensors", wrapped<save_tensors>}, {nullptr, nullptr}};
  lua_newtable(L);
  luaL_setfuncs(L, fns, 0);
  lua_setfield(L, core, "hf");
}

}  // namespace me::lua
