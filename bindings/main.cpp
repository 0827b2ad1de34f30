// The `megaengine` command: run a recipe, run a chunk, or open the REPL.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bindings/lua_host.h"
#include "bindings/repl.h"
#include "engine/core/log.h"

namespace {

const char* kUsage =
    "usage: megaengine [options] [recipe.lua [key=value ...]]\n"
    "\n"
    "  megaengine recipe.lua [key=value ...]  run a recipe; overrides reach any field by dotted path,\n"
    "                                         e.g. train.iters=50 optimizer.lr=3e-4 device=cuda\n"
    "  megaengine -i recipe.lua [key=value]   run it, then stay in the REPL with recipe, trainer, summary\n"
    "  megaengine -e 'lua code'               run a chunk (may repeat; runs before any recipe)\n"
    "  megaengine --dry-run recipe.lua ...    print the resolved recipe and its parameter count, do not train\n"
    "  megaengine                             open the REPL\n"
    "  megaengine --help | --version\n"
    "\n"
    "environment: ME_LOG_LEVEL=trace|debug|info|warn|error, ME_ASSET_DIR, ME_HISTORY\n";

int die(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "megaengine: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> chunks;
  std::string recipe;
  std::vector<std::string> rest;
  bool interactive = false, dry_run = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (!recipe.empty()) {
      rest.push_back(a);
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "-v" || a == "--version") {
      me::lua::LuaHost host;
      std::string error;
      const bool ok = host.run_chunk(
          "local me = require 'megaengine'; print(('megaengine %s (Lua 5.4, LibTorch %s)'):format(me.version, me.torch_version))",
          "=version", &error);
      return ok ? 0 : die(error);
    } else if (a == "-e") {
      if (i + 1 >= argc) return die("-e needs a chunk of Lua code: megaengine -e 'print(1)'");
      chunks.push_back(argv[++i]);
    } else if (a == "-i") {
      interactive = true;
    } else if (a == "--dry-run") {
      dry_run = true;
    } else if (a.size() > 1 && a[0] == '-') {
      return die("unknown option '" + a + "' (see megaengine --help)");
    } else {
      recipe = a;
    }
  }

  try {
    me::log::init_from_env();
    me::lua::LuaHost host;
    std::string error;
    for (const auto& c : chunks)
      if (!host.run_chunk(c, "=(command line)", &error)) return die(error);
    if (!recipe.empty() && !host.run_file(recipe, rest, dry_run, interactive, &error)) {
      if (!interactive) return die(error);
      std::fprintf(stderr, "megaengine: %s\n", error.c_str());
    }
    if (interactive || (recipe.empty() && chunks.empty())) me::lua::run_repl(host.state());
  } catch (const std::exception& e) {
    return die(e.what());
  }
  return 0;
}
