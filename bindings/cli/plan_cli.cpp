#include "bindings/cli/plan_cli.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bindings/lua/lua_host.h"
#include "engine/core/exit_status.h"
#include "engine/core/log.h"
#include "engine/core/strings.h"  // positive_count
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
    "  In a recipe, parallel = \"auto\" (or --plan on the command line) trains with the best layout.\n"
    "\n"
    "       megaengine [--nproc N] plan --calibrate OUT.json [--device cuda|cpu] [--base NAME|FILE]\n"
    "                                   [--name NAME] [--gpu-memory 80GB]\n"
    "  Measures this machine (GEMMs, attention, memory bandwidth; with --nproc N the collectives over\n"
    "  N ranks of this node) and writes a profile for --profile; what it cannot measure (the inter-node\n"
    "  link, the exposure of TP and DP traffic) comes from --base (default h100-80gb).\n";

// A Lua string literal of `s`.
std::string lua_literal(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "megaengine: %s\n%s", message.c_str(), kPlanUsage);
  return kExitUsage;
}

}  // namespace

int plan_main(int argc, char** argv) {
  RunFileOptions o;
  o.plan = true;
  std::string recipe, calibrate, device, base = "h100-80gb", name;
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
      const long v = positive_count(value);
      if (v == 0) return usage_error(a + " needs a positive number, got '" + (value ? value : "") + "'");
      (a == "--nodes" ? o.nodes : a == "--top" ? o.top : o.gpus_per_node) = static_cast<int>(v);
      ++i;
    } else if (a == "--gpu" || a == "--profile" || a == "--gpu-memory" || a == "--calibrate" || a == "--device" ||
               a == "--base" || a == "--name") {
      if (!value || !*value) return usage_error(a + " needs a value");
      (a == "--gpu" ? o.gpu : a == "--profile" ? o.profile : a == "--gpu-memory" ? o.gpu_memory
                      : a == "--calibrate" ? calibrate : a == "--device" ? device : a == "--base" ? base : name) = value;
      ++i;
    } else if (a.size() > 1 && a[0] == '-') {
      return usage_error("unknown option '" + a + "'");
    } else if (recipe.empty()) {
      recipe = a;
    } else {
      rest.push_back(a);
    }
  }
  if (!calibrate.empty()) {
    if (!recipe.empty()) return usage_error("--calibrate measures this machine; it takes no recipe ('" + recipe + "')");
    if (!device.empty() && device != "cpu" && device != "cuda") return usage_error("--device: cpu or cuda, got '" + device + "'");
    try {
      std::string chunk = "require('megaengine.calibrate').run{ out = " + lua_literal(calibrate) + ", base = " + lua_literal(base);
      if (!device.empty()) chunk += ", device = " + lua_literal(device);
      if (!name.empty()) chunk += ", name = " + lua_literal(name);
      if (!o.gpu_memory.empty()) chunk += ", gpu_memory_gb = " + std::to_string(plan::parse_memory_size(o.gpu_memory) / 1e9);
      chunk += " }";
      log::init_from_env();
      LuaHost host;
      std::string error;
      if (host.run_chunk(chunk, "=calibrate", &error)) return 0;
      std::fflush(stdout);
      std::fprintf(stderr, "megaengine: %s\n", error.substr(0, error.find("\nstack traceback")).c_str());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "megaengine: %s\n", e.what());
      return 1;
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
