#include "bindings/cli/plan_cli.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bindings/lua/lua_host.h"
#include "engine/core/exit_status.h"
#include "engine/core/log.h"
#include "engine/plan/device_profile.h"
#include "engine/plan/memory_advice.h"

namespace me::lua {
namespace {

const char* kPlanUsage =
    "usage: megaengine plan RECIPE [--nodes N] [--gpus-per-node G] [--gpu NAME | --profile FILE]\n"
    "                              [--gpu-memory 80GB] [--top K] [key=value ...]\n"
    "  Ranks every layout of RECIPE's model on N nodes of G GPUs (tp inside a node; pp, dp, sequence\n"
    "  parallelism, recompute, micro batch and the distributed optimizer) by estimated step time, drops\n"
    "  those that do not fit, and prints the best K (default 5) with their time split, memory, MFU and\n"
    "  days for the recipe's samples, and the overrides that select each. The recipe's global batch\n"
    "  stays. Defaults: --nodes 1, --gpus-per-node 8, --gpu h100-80gb (built in: see below).\n"
    "  Nothing is allocated and no data is read (ME_DRY_RUN=1 is set for the recipe).\n"
    "  In a recipe, parallel = \"auto\" (or --plan on the command line) trains with the best layout.\n";

int usage_error(const std::string& message) {
  std::fprintf(stderr, "megaengine: %s\n%s", message.c_str(), kPlanUsage);
  return kExitUsage;
}

long count(const char* text) {
  char* end = nullptr;
  const long v = text ? std::strtol(text, &end, 10) : 0;
  return (!text || !end || *end || v < 1 || v > 1 << 20) ? 0 : v;
}

}  // namespace

int plan_main(int argc, char** argv) {
  RunFileOptions o;
  o.plan = true;
  std::string recipe;
  std::vector<std::string> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "-h" || a == "--help") {
      std::fputs(kPlanUsage, stdout);
      std::string names;
      for (const auto& n : plan::builtin_profile_names()) names += " " + n;
      std::printf("  built-in profiles:%s\n", names.c_str());
      return 0;
    }
    if (a == "--nodes" || a == "--gpus-per-node" || a == "--top") {
      const long v = count(value);
      if (v == 0) return usage_error(a + " needs a positive number, got '" + (value ? value : "") + "'");
      (a == "--nodes" ? o.nodes : a == "--top" ? o.top : o.gpus_per_node) = static_cast<int>(v);
      ++i;
    } else if (a == "--gpu" || a == "--profile" || a == "--gpu-memory") {
      if (!value || !*value) return usage_error(a + " needs a value");
      (a == "--gpu" ? o.gpu : a == "--profile" ? o.profile : o.gpu_memory) = value;
      ++i;
    } else if (a.size() > 1 && a[0] == '-') {
      return usage_error("unknown option '" + a + "'");
    } else if (recipe.empty()) {
      recipe = a;
    } else {
      rest.push_back(a);
    }
  }
  if (recipe.empty()) return usage_error("plan needs a recipe file, e.g. megaengine plan recipes/gpt39b.lua --nodes 2");
  if (!o.gpu.empty() && !o.profile.empty()) return usage_error("give --gpu NAME or --profile FILE, not both");
  try {
    if (!o.gpu_memory.empty()) plan::parse_memory_size(o.gpu_memory);
    log::init_from_env();
    setenv("ME_DRY_RUN", "1", 1);  // recipes leave out what only training needs (data paths)
    LuaHost host;
    std::string error;
    int status = 0;
    if (!host.run_file(recipe, rest, o, &error, &status)) {
      std::fflush(stdout);
      std::fprintf(stderr, "megaengine: %s\n", error.c_str());
      return 1;
    }
    return status;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "megaengine: %s\n", e.what());
    return 1;
  }
}

}  // namespace me::lua
