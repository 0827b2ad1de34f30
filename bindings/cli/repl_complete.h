// Tab completion for the REPL, kept apart from libedit so it can be tested on its own.
#pragma once
#include <string>
#include <vector>

struct lua_State;

namespace me::lua {

// The completions of `word`, the text before the cursor back to the last operator or space:
//   "pri"          -> global names (and Lua keywords) that start with it: "print", ...
//   "me.mo"        -> "me.model": the fields of the table `me` that start with "mo"
//   "trainer:"     -> "trainer:run", "trainer:sample", ...: the methods of the value, found
//                     in its metatable (__index when it is a table, else a `methods` table)
// Names are looked up without calling anything (raw reads, __index tables only), so completing
// never runs user code. Names starting with "_" are offered only when the word's last part
// does. Sorted, no duplicates; empty when nothing matches or the path does not resolve.
std::vector<std::string> completions(lua_State* L, const std::string& word);

// The characters that end a word for completion: everything that cannot be part of a.b:c.
extern const char* const kCompletionWordBreaks;

}  // namespace me::lua
