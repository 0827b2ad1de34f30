#include "bindings/lua/lua_host.h"

#include <cstring>

extern "C" {
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
}

#include "bindings/lua/lua_modules.h"
#include "bindings/lua/lua_util.h"
#include "bindings/lua/modules.h"

#ifndef ME_SOURCE_DIR
#define ME_SOURCE_DIR "."
#endif
#ifndef ME_VERSION
#define ME_VERSION "0.0.0"
#endif

namespace me::lua {

namespace {

const char* embedded_source(const char* name) {
  for (const auto* m = kEmbeddedModules; m->name; ++m)
    if (std::strcmp(m->name, name) == 0) return m->source;
  return nullptr;
}

// Loads an embedded module's chunk, named "[module]" in messages and tracebacks.
void load_embedded(lua_State* L, const char* name) {
  const char* source = embedded_source(name);
  const std::string chunk = std::string("=[") + name + "]";
  // A broken embedded module is a build bug; say so plainly.
  if (!source || luaL_loadbuffer(L, source, std::strlen(source), chunk.c_str()) != LUA_OK) lua_error(L);
}

// package.preload's loader for "megaengine.NAME" modules.
int open_submodule(lua_State* L) {
  load_embedded(L, luaL_checkstring(L, 1));
  lua_call(L, 0, 1);
  return 1;
}

}  // namespace

int open_megaengine(lua_State* L) {
  lua_newtable(L);
  const int core = lua_gettop(L);
  lua_pushstring(L, ME_VERSION);
  lua_setfield(L, core, "version");
  lua_pushstring(L, ME_SOURCE_DIR);
  lua_setfield(L, core, "source_dir");
  open_tensor(L, core);
  open_model(L, core);
  open_train(L, core);
  open_comm(L, core);
  open_data(L, core);
  open_parallel(L, core);
  open_dry_run(L, core);
  open_plan(L, core);
  open_hf(L, core);
  load_embedded(L, "megaengine");
  lua_pushvalue(L, core);
  lua_call(L, 1, 1);
  return 1;
}

LuaHost::LuaHost() : L_(luaL_newstate()) {
  if (!L_) throw Error("cannot create a Lua state (out of memory)");
  luaL_openlibs(L_);
  luaL_getsubtable(L_, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  for (const auto* m = kEmbeddedModules; m->name; ++m) {
    lua_pushcfunction(L_, std::strcmp(m->name, "megaengine") == 0 ? open_megaengine : open_submodule);
    lua_setfield(L_, -2, m->name);
  }
  lua_pop(L_, 1);
}

LuaHost::~LuaHost() { lua_close(L_); }

namespace {

bool call(lua_State* L, int nargs, int nresults, std::string* error) {
  try {
    protected_call(L, nargs, nresults);
    return true;
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
}

}  // namespace

bool LuaHost::run_chunk(const std::string& code, const std::string& chunkname, std::string* error) {
  if (luaL_loadbuffer(L_, code.data(), code.size(), chunkname.c_str()) != LUA_OK) {
    *error = lua_tostring(L_, -1);
    lua_pop(L_, 1);
    return false;
  }
  return call(L_, 0, 0, error);
}

bool LuaHost::run_file(const std::string& path, const std::vector<std::string>& args, const RunFileOptions& options,
                       std::string* error, int* exit_status) {
  const int top = lua_gettop(L_);
  // arg, as the stock `lua` interpreter sets it: arg[0] = script, arg[1..] = its arguments.
  lua_createtable(L_, static_cast<int>(args.size()), 1);
  lua_pushstring(L_, path.c_str());
  lua_rawseti(L_, -2, 0);
  for (size_t i = 0; i < args.size(); ++i) {
    lua_pushstring(L_, args[i].c_str());
    lua_rawseti(L_, -2, static_cast<lua_Integer>(i + 1));
  }
  lua_setglobal(L_, "arg");

  lua_getglobal(L_, "require");
  lua_pushstring(L_, "megaengine");
  if (!call(L_, 1, 1, error)) return false;
  lua_getfield(L_, -1, "_run_file");
  lua_pushstring(L_, path.c_str());
  lua_newtable(L_);
  for (size_t i = 0; i < args.size(); ++i) {
    lua_pushstring(L_, args[i].c_str());
    lua_rawseti(L_, -2, static_cast<lua_Integer>(i + 1));
  }
  lua_newtable(L_);
  lua_pushboolean(L_, options.dry_run);
  lua_setfield(L_, -2, "dry_run");
  if (options.world > 0) {
    lua_pushinteger(L_, options.world);
    lua_setfield(L_, -2, "world");
  }
  lua_pushinteger(L_, options.gpus_per_node);
  lua_setfield(L_, -2, "gpus_per_node");
  if (!options.gpu_memory.empty()) {
    lua_pushstring(L_, options.gpu_memory.c_str());
    lua_setfield(L_, -2, "gpu_memory");
  }
  lua_pushboolean(L_, options.plan);
  lua_setfield(L_, -2, "plan");
  if (options.plan) {
    lua_pushinteger(L_, options.nodes);
    lua_setfield(L_, -2, "nodes");
    lua_pushinteger(L_, options.top);
    lua_setfield(L_, -2, "top");
  }
  for (const auto& [key, value] : {std::pair{"gpu", &options.gpu}, std::pair{"profile", &options.profile}})
    if (!value->empty()) {
      lua_pushstring(L_, value->c_str());
      lua_setfield(L_, -2, key);
    }
  if (!call(L_, 3, 3, error)) {
    lua_settop(L_, top);
    return false;
  }
  if (exit_status) {
    *exit_status = 0;
    if (lua_istable(L_, -1)) {  // the summary
      if (lua_getfield(L_, -1, "exit_status") == LUA_TNUMBER) *exit_status = static_cast<int>(lua_tointeger(L_, -1));
      lua_pop(L_, 1);
    }
  }
  if (options.interactive) {
    lua_setglobal(L_, "summary");
    lua_setglobal(L_, "trainer");
    lua_setglobal(L_, "recipe");
    lua_setglobal(L_, "me");
  }
  lua_settop(L_, top);
  return true;
}

}  // namespace me::lua
