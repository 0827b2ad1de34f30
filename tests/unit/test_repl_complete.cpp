// The REPL's tab completion (bindings/cli/repl_complete.h) on a real Lua host: fields, methods,
// globals and keywords, and that completing never calls user code.
#include <catch2/catch.hpp>

extern "C" {
#include <lua.h>
}

#include <algorithm>
#include <string>
#include <vector>

#include "bindings/lua/lua_host.h"
#include "bindings/cli/repl_complete.h"

using me::lua::completions;
using me::lua::LuaHost;
using Names = std::vector<std::string>;

namespace {
bool has(const Names& names, const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); }

void run(LuaHost& host, const std::string& code) {
  std::string error;
  INFO(error);
  REQUIRE(host.run_chunk(code, "=test", &error));
}
}  // namespace

TEST_CASE("completion: fields of tables, globals and keywords", "[repl]") {
  LuaHost host;
  run(host, "me = require 'megaengine'");
  lua_State* L = host.state();
  const int top = lua_gettop(L);
  CHECK(completions(L, "me.mo") == Names{"me.model"});
  CHECK(completions(L, "me.model.") == Names{"me.model.gpt", "me.model.llama"});
  CHECK(completions(L, "me.optim.a") == Names{"me.optim.adamw"});
  const Names globals = completions(L, "pr");
  CHECK(has(globals, "print"));
  CHECK(completions(L, "ret") == Names{"return"});
  CHECK(has(completions(L, "m"), "me"));
  // Names starting with "_" only when asked for.
  CHECK_FALSE(has(completions(L, "me."), "me._run_file"));
  CHECK(has(completions(L, "me._"), "me._run_file"));
  CHECK_FALSE(has(completions(L, ""), "_G"));
  // Paths that do not resolve complete to nothing.
  CHECK(completions(L, "nosuch.x").empty());
  CHECK(completions(L, "me.model.gpt.x").empty());  // a function has no fields
  CHECK(completions(L, "me..x").empty());
  CHECK(completions(L, "me:model.x").empty());
  CHECK(lua_gettop(L) == top);
}

TEST_CASE("completion: methods after ':' from the metatable", "[repl]") {
  LuaHost host;
  run(host, "me = require 'megaengine'; t = me.tensor.ones{2}; spec = me.model.gpt{}; s = 'text'; "
            "tok = me.tokenizer.load(me.tokenizer.gpt2{})");
  lua_State* L = host.state();
  const Names tensor = completions(L, "t:");
  CHECK(has(tensor, "t:sum"));     // a tensor's __index is a function: methods come from `methods`
  CHECK(has(tensor, "t:matmul"));
  CHECK(completions(L, "t:mat") == Names{"t:matmul"});
  CHECK(completions(L, "spec:") == Names{"spec:build", "spec:parameter_count"});  // only functions
  CHECK(has(completions(L, "spec."), "spec.hidden"));                             // fields after '.'
  CHECK(completions(L, "s:up") == Names{"s:upper"});
  CHECK(completions(L, "tok:") == Names{"tok:decode", "tok:encode", "tok:eod", "tok:vocab_size"});
}

TEST_CASE("completion never runs user code", "[repl]") {
  LuaHost host;
  run(host, "calls = 0; trap = setmetatable({ real = 1 }, { __index = function() calls = calls + 1 end }); "
            "lazy = setmetatable({}, { __index = { inherited = 2 } })");
  lua_State* L = host.state();
  CHECK(completions(L, "trap.") == Names{"trap.real"});
  CHECK(completions(L, "trap.nothing.x").empty());
  CHECK(completions(L, "lazy.in") == Names{"lazy.inherited"});
  run(host, "assert(calls == 0, 'completion called __index ' .. calls .. ' times')");
}
