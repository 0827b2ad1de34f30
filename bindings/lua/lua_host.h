// The embedded Lua 5.4 host: a state with the standard libraries and `require "megaengine"`
// (the C++ core plus the embedded bindings/lua/megaengine.lua).
#pragma once
#include <string>
#include <vector>

struct lua_State;

namespace me::lua {

// How `megaengine FILE` runs a recipe file (main.cpp's flags).
struct RunFileOptions {
  bool dry_run = false;      // --dry-run: print the recipe and the layout and memory report, do not train
  bool interactive = false;  // -i: leave recipe, trainer, summary for the REPL
  int world = 0;             // --world N: the dry run's GPUs (0: tp x pp)
  int gpus_per_node = 8;     // --gpus-per-node
  std::string gpu_memory;    // --gpu-memory (empty: 80GB; `plan`: the profile's)
  // `megaengine plan`: rank the layouts of `nodes` x gpus_per_node GPUs of profile `gpu` (or
  // the file `profile`), print the best `top`; nothing trains. `gpu` and `profile` also serve
  // a dry run of parallel = "auto".
  bool plan = false;
  int nodes = 1, top = 5;
  std::string gpu, profile;
};

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
  bool run_file(const std::string& path, const std::vector<std::string>& args, const RunFileOptions& options,
                std::string* error, int* exit_status = nullptr);

 private:
  lua_State* L_;
};

// package.preload["megaengine"]
int open_megaengine(lua_State* L);

}  // namespace me::lua
