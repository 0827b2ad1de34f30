#include "bindings/cli/repl_complete.h"

extern "C" {
#include <lauxlib.h>
#include <lua.h>
}

#include <algorithm>
#include <cctype>
#include <cstring>
#include <set>

namespace me::lua {

const char* const kCompletionWordBreaks = " \t\n\"\\'`@$><=;|&{}()[],+-*/%^#~";

namespace {

constexpr int kMaxIndexDepth = 8;  // __index chains followed while looking a name up

bool is_identifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// Pushes the table where the methods of the value at `idx` live (its metatable's __index when a
// table, else its metatable's `methods`), or nothing and returns false.
bool push_method_table(lua_State* L, int idx) {
  if (!lua_getmetatable(L, idx)) return false;
  for (const char* field : {"__index", "methods"}) {
    if (lua_getfield(L, -1, field) == LUA_TTABLE) {
      lua_remove(L, -2);
      return true;
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return false;
}

// Pushes value[key] without calling anything: a raw read, then the same in its __index tables.
// Pushes nil when the field is not found that way.
void push_field(lua_State* L, int idx, const std::string& key) {
  lua_pushvalue(L, idx);
  for (int depth = 0; depth < kMaxIndexDepth; ++depth) {
    if (lua_type(L, -1) == LUA_TTABLE) {
      lua_pushlstring(L, key.data(), key.size());
      if (lua_rawget(L, -2) != LUA_TNIL) {
        lua_remove(L, -2);
        return;
      }
      lua_pop(L, 1);
    }
    if (!push_method_table(L, -1)) break;
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
  lua_pushnil(L);
}

// Adds the identifier keys of the value at `idx` (and of its __index tables) that start with
// `prefix`; with `methods_only`, only those holding functions.
void collect(lua_State* L, int idx, const std::string& prefix, bool methods_only, std::set<std::string>& out) {
  lua_pushvalue(L, idx);
  for (int depth = 0; depth < kMaxIndexDepth; ++depth) {
    if (lua_type(L, -1) == LUA_TTABLE) {
      lua_pushnil(L);
      while (lua_next(L, -2)) {
        if (lua_type(L, -2) == LUA_TSTRING && (!methods_only || lua_isfunction(L, -1))) {
          const std::string name = lua_tostring(L, -2);
          if (name.compare(0, prefix.size(), prefix) == 0 && is_identifier(name) &&
              (name[0] != '_' || (!prefix.empty() && prefix[0] == '_')))
            out.insert(name);
        }
        lua_pop(L, 1);
      }
    }
    if (!push_method_table(L, -1)) break;
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
}

const char* const kKeywords[] = {"and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto",
                                 "if", "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until",
                                 "while"};

// Pushes the value that the dotted `path` names, starting from the globals; nil when a part is
// not an identifier or not found.
void push_path(lua_State* L, const std::string& path) {
  lua_pushglobaltable(L);
  for (size_t begin = 0;;) {
    const size_t dot = path.find('.', begin);
    const std::string part = path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    if (!is_identifier(part)) {
      lua_pop(L, 1);
      lua_pushnil(L);
      return;
    }
    push_field(L, -1, part);
    lua_remove(L, -2);
    if (dot == std::string::npos || lua_isnil(L, -1)) return;
    begin = dot + 1;
  }
}

}  // namespace

std::vector<std::string> completions(lua_State* L, const std::string& word) {
  const int top = lua_gettop(L);
  const size_t sep = word.find_last_of(".:");
  std::set<std::string> names;
  std::string head, partial = word;
  if (sep == std::string::npos) {  // a global name or a keyword
    for (const char* k : kKeywords)
      if (std::strncmp(k, word.c_str(), word.size()) == 0) names.insert(k);
    lua_pushglobaltable(L);
    collect(L, lua_gettop(L), word, false, names);
  } else {
    head = word.substr(0, sep + 1);
    partial = word.substr(sep + 1);
    push_path(L, word.substr(0, sep));
    if (!lua_isnil(L, -1)) collect(L, lua_gettop(L), partial, word[sep] == ':', names);
  }
  lua_settop(L, top);
  std::vector<std::string> out;
  for (const auto& n : names) out.push_back(head + n);
  return out;
}

}  // namespace me::lua
