// The embedded Lua 5.4 host: a state with the standard libraries and `require "megaengine"`
// (the C++ core plus the embedded bindings/lua/megaengine.lua).
#pragma once
#include <string>
#include <vector>

struct lua_State;

namespace me::lua {

class LuaHost {
 public:
  LuaHost();
  ~LuaHost();
  LuaHost(const LuaHost&) = delete;
  LuaHost& operator=(const LuaHost&) = delete;

  lua_State* state() const { return L_; }

  // Each returns false and fills *error (message + the user's traceback) on failure.
  bool run_chunk(const std::string& code, const std::string& chunkname, std::string* error);
  // megaengine FILE [args]: runs it and trains the recipe it returns. With `interactive`,
  // the globals recipe, trainer and summary are left for the REPL. *exit_status: what the run
  // asks the process to exit with (summary.exit_status; 0 when it has none).
  bool run_file(const std::string& path, const std::vector<std::string>& args, bool dry_run, bool interactive,
                std::string* error, int* exit_status = nullptr);

 private:
  lua_State* L_;
};

// package.preload["megaengine"]
int open_megaengine(lua_State* L);

}  // namespace me::lua
