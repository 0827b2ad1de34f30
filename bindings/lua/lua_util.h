// Glue shared by every binding file. Lua (built as C) reports errors with longjmp, which
// must never cross C++ frames holding live objects: binding functions therefore throw
// me::Error, and `wrapped<F>` turns that into a Lua error after those frames are gone.
#pragma once
extern "C" {
#include <lauxlib.h>
#include <lua.h>
}

#include <cstdint>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/error.h"

namespace me::lua {

// LibTorch's c10::Error carries a C++ backtrace in what(); users get the first line only.
std::string clean_message(const char* what);

template <lua_CFunction F>
int wrapped(lua_State* L) {
  int results = -1;
  {
    std::string message;
    try {
      results = F(L);
    } catch (const std::exception& e) {
      message = clean_message(e.what());
    }
    if (results >= 0) return results;
    lua_pushlstring(L, message.data(), message.size());
  }
  return lua_error(L);
}

// "bad argument #2 to 'randn' (table of sizes expected, got string)" -- thrown, not raised.
[[noreturn]] void arg_error(lua_State* L, int arg, const std::string& expected);

double check_number(lua_State* L, int arg);
int64_t check_integer(lua_State* L, int arg);
std::string check_string(lua_State* L, int arg);
void check_table(lua_State* L, int arg);
std::optional<double> opt_number(lua_State* L, int arg);

// Typed reads of `t.field` for recipe tables; `path` names the table in messages
// ("model.hidden: expected an integer, got string").
int64_t field_integer(lua_State* L, int t, const char* field, const std::string& path, std::optional<int64_t> fallback = {});
double field_number(lua_State* L, int t, const char* field, const std::string& path, std::optional<double> fallback = {});
bool field_boolean(lua_State* L, int t, const char* field, const std::string& path, std::optional<bool> fallback = {});
std::string field_string(lua_State* L, int t, const char* field, const std::string& path, std::optional<std::string> fallback = {});
// Pushes t.field when it is a table and returns true; false (nothing pushed) when nil.
bool push_field_table(lua_State* L, int t, const char* field, const std::string& path);

// Userdata holding a C++ object by value, with a named metatable whose __gc destroys it.
template <typename T, typename... Args>
T* push_object(lua_State* L, const char* meta, Args&&... args) {
  void* mem = lua_newuserdatauv(L, sizeof(T), 0);
  T* obj = new (mem) T(std::forward<Args>(args)...);
  luaL_setmetatable(L, meta);
  return obj;
}

template <typename T>
T* test_object(lua_State* L, int arg, const char* meta) {
  return static_cast<T*>(luaL_testudata(L, arg, meta));
}

template <typename T>
T& check_object(lua_State* L, int arg, const char* meta, const char* what) {
  if (T* obj = test_object<T>(L, arg, meta)) return *obj;
  arg_error(L, arg, what);
}

template <typename T>
int destroy_object(lua_State* L) {
  static_cast<T*>(lua_touserdata(L, 1))->~T();
  return 0;
}

// Creates metatable `meta` with methods reachable through __index and the given
// metamethods, all wrapped; __gc destroys T.
template <typename T>
void define_class(lua_State* L, const char* meta, const luaL_Reg* methods, const luaL_Reg* metamethods) {
  luaL_newmetatable(L, meta);
  luaL_setfuncs(L, metamethods, 0);
  lua_pushcfunction(L, destroy_object<T>);
  lua_setfield(L, -2, "__gc");
  if (methods) {
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
}

// The message handler for lua_pcall: the message plus a traceback of the user's own
// frames (recipe files, REPL lines), without the engine's internal ones.
int traceback_handler(lua_State* L);

// Runs the function at the top of the stack (with nargs above it) under traceback_handler;
// on error throws me::Error with the message and traceback.
void protected_call(lua_State* L, int nargs, int nresults);

}  // namespace me::lua
