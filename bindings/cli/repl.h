#pragma once
struct lua_State;

namespace me::lua {

// The interactive loop: line editing and history (libedit), multi-line statements,
// `=expr` and bare expressions print their values through me.pretty. Returns at EOF.
void run_repl(lua_State* L);

}  // namespace me::lua
