#include "bindings/lua/lua_util.h"

#include <cmath>
#include <cstring>
#include <sstream>

namespace me::lua {

std::string clean_message(const char* what) {
  std::string s = what ? what : "unknown error";
  for (const char* marker : {"\nException raised from", "Exception raised from"}) {
    auto pos = s.find(marker);
    if (pos != std::string::npos && pos > 0) s.erase(pos);
  }
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

void arg_error(lua_State* L, int arg, const std::string& expected) {
  lua_Debug ar;
  std::string fname = "?";
  if (lua_getstack(L, 0, &ar)) {
    lua_getinfo(L, "n", &ar);
    if (ar.name) fname = ar.name;
    if (ar.namewhat && std::strcmp(ar.namewhat, "method") == 0) {
      --arg;  // `t:f(x)`: the user counts from x
      if (arg == 0) fail("calling '", fname, "' on bad self (", expected, " expected, got ", luaL_typename(L, 1), ")");
    }
  }
  const int idx = (ar.namewhat && std::strcmp(ar.namewhat, "method") == 0) ? arg + 1 : arg;
  const char* got = lua_gettop(L) >= idx ? luaL_typename(L, idx) : "no value";
  // A userdata of ours says which class it is.
  if (lua_gettop(L) >= idx && lua_getmetatable(L, idx)) {
    lua_getfield(L, -1, "__name");
    if (lua_type(L, -1) == LUA_TSTRING) got = lua_tostring(L, -1);
    lua_pop(L, 2);
  }
  fail("bad argument #", arg, " to '", fname, "' (", expected, " expected, got ", got, ")");
}

double check_number(lua_State* L, int arg) {
  int ok = 0;
  double v = lua_tonumberx(L, arg, &ok);
  if (!ok || lua_type(L, arg) != LUA_TNUMBER) arg_error(L, arg, "number");
  return v;
}

int64_t check_integer(lua_State* L, int arg) {
  int ok = 0;
  if (lua_type(L, arg) == LUA_TNUMBER) {
    lua_Integer v = lua_tointegerx(L, arg, &ok);
    if (ok) return v;
  }
  arg_error(L, arg, "integer");
}

std::string check_string(lua_State* L, int arg) {
  if (lua_type(L, arg) != LUA_TSTRING) arg_error(L, arg, "string");
  size_t n = 0;
  const char* s = lua_tolstring(L, arg, &n);
  return std::string(s, n);
}

void check_table(lua_State* L, int arg) {
  if (lua_type(L, arg) != LUA_TTABLE) arg_error(L, arg, "table");
}

std::optional<double> opt_number(lua_State* L, int arg) {
  if (lua_isnoneornil(L, arg)) return std::nullopt;
  return check_number(L, arg);
}

namespace {

// Pushes t[field]; returns its type. Uses raw access: recipe tables are plain data.
int get_field(lua_State* L, int t, const char* field) {
  lua_pushstring(L, field);
  return lua_rawget(L, t < 0 && t > LUA_REGISTRYINDEX ? t - 1 : t);
}

[[noreturn]] void field_error(lua_State* L, const std::string& path, const char* field, const char* expected) {
  std::string got = luaL_typename(L, -1);
  if (lua_type(L, -1) == LUA_TSTRING) got += cat(" '", lua_tostring(L, -1), "'");
  if (lua_type(L, -1) == LUA_TNUMBER) got = cat("number ", lua_tostring(L, -1));
  lua_pop(L, 1);
  fail(path, ".", field, ": expected ", expected, ", got ", got);
}

}  // namespace

int64_t field_integer(lua_State* L, int t, const char* field, const std::string& path, std::optional<int64_t> fallback) {
  const int type = get_field(L, t, field);
  if (type == LUA_TNIL && fallback) {
    lua_pop(L, 1);
    return *fallback;
  }
  int ok = 0;
  lua_Integer v = type == LUA_TNUMBER ? lua_tointegerx(L, -1, &ok) : 0;
  if (!ok) field_error(L, path, field, "an integer");
  lua_pop(L, 1);
  return v;
}

double field_number(lua_State* L, int t, const char* field, const std::string& path, std::optional<double> fallback) {
  const int type = get_field(L, t, field);
  if (type == LUA_TNIL && fallback) {
    lua_pop(L, 1);
    return *fallback;
  }
  if (type != LUA_TNUMBER) field_error(L, path, field, "a number");
  double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  if (!std::isfinite(v)) fail(path, ".", field, ": expected a finite number, got ", v);
  return v;
}

bool field_boolean(lua_State* L, int t, const char* field, const std::string& path, std::optional<bool> fallback) {
  const int type = get_field(L, t, field);
  if (type == LUA_TNIL && fallback) {
    lua_pop(L, 1);
    return *fallback;
  }
  if (type != LUA_TBOOLEAN) field_error(L, path, field, "a boolean");
  bool v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

std::string field_string(lua_State* L, int t, const char* field, const std::string& path, std::optional<std::string> fallback) {
  const int type = get_field(L, t, field);
  if (type == LUA_TNIL && fallback) {
    lua_pop(L, 1);
    return *fallback;
  }
  if (type != LUA_TSTRING) field_error(L, path, field, "a string");
  size_t n = 0;
  const char* s = lua_tolstring(L, -1, &n);
  std::string v(s, n);
  lua_pop(L, 1);
  return v;
}

bool push_field_table(lua_State* L, int t, const char* field, const std::string& path) {
  const int type = get_field(L, t, field);
  if (type == LUA_TTABLE) return true;
  if (type != LUA_TNIL) field_error(L, path, field, "a table");
  lua_pop(L, 1);
  return false;
}

int traceback_handler(lua_State* L) {
  const char* msg = lua_tostring(L, 1);
  if (!msg) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  if (std::strstr(msg, "stack traceback:")) return 1;  // already carries one (error from a hook)
  luaL_traceback(L, L, nullptr, 1);
  std::istringstream lines(lua_tostring(L, -1));
  std::string line, kept;
  const bool debug = getenv("ME_LUA_TRACEBACK_ALL") != nullptr;
  while (std::getline(lines, line)) {
    if (line == "stack traceback:") continue;
    if (!debug && (line.find("[megaengine") != std::string::npos || line.find("[C]:") != std::string::npos)) continue;
    kept += "\n" + line;
  }
  lua_pop(L, 1);
  if (kept.empty()) return 1;
  lua_pushfstring(L, "%s\nstack traceback:%s", msg, kept.c_str());
  return 1;
}

void protected_call(lua_State* L, int nargs, int nresults) {
  const int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback_handler);
  lua_insert(L, base);
  const int rc = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  if (rc != LUA_OK) {
    std::string msg = lua_tostring(L, -1) ? lua_tostring(L, -1) : "error object is not a string";
    lua_pop(L, 1);
    throw Error(msg);
  }
}

}  // namespace me::lua
