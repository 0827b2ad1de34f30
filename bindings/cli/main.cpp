// The `megaengine` command: run a recipe, run a chunk, open the REPL, or one of the subcommands
// of kSubcommands (doctor, preprocess, checkpoint, export, import).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <malloc.h>
#include <unistd.h>

#include <cstdlib>

#include "bindings/cli/checkpoint_cli.h"
#include "bindings/cli/doctor.h"
#include "bindings/cli/hf_cli.h"
#include "bindings/cli/plan_cli.h"
#include "bindings/lua/lua_host.h"
#include "engine/launch/launcher.h"
#include "bindings/cli/repl.h"
#include "engine/core/exit_status.h"
#include "engine/core/log.h"
#include "engine/core/strings.h"  // positive_count
#include "engine/plan/memory_advice.h"
#include "engine/core/build_config.h"  // ME_HAVE_TOKENIZERS
#if ME_HAVE_TOKENIZERS
#include "engine/data/preprocess.h"
#endif

namespace {

const char* kUsage =
    "usage: megaengine [options] [recipe.lua [key=value ...]]\n"
    "\n"
    "  megaengine recipe.lua [key=value ...]  run a recipe; overrides reach any field by dotted path,\n"
    "                                         e.g. train.iters=50 optimizer.lr=3e-4 device=cuda\n"
    "  megaengine -i recipe.lua [key=value]   run it, then stay in the REPL with recipe, trainer, summary\n"
    "  megaengine -e 'lua code'               run a chunk with `me` defined (may repeat; runs before any recipe)\n"
    "  megaengine --dry-run recipe.lua ... [--world N] [--gpu-memory 80GB] [--gpus-per-node 8] [--gpu h100-80gb]\n"
    "                                         print the resolved recipe, the layout of N GPUs (tp/pp/dp groups\n"
    "                                         and their nodes), parameter counts, the memory per GPU with a\n"
    "                                         verdict and the estimated step time (--gpu's profile); nothing is\n"
    "                                         allocated and no data is read (ME_DRY_RUN=1\n"
    "                                         is set for the recipe, so it can skip what needs data paths)\n"
    "  megaengine --fields [section]          every recipe field with its type, default and help\n"
    "  megaengine --nproc N recipe.lua ...    start N ranks on this machine (RANK, WORLD_SIZE, MASTER_* set,\n"
    "                                         output prefixed by rank; if one fails, the others are stopped)\n"
    "  megaengine doctor [--json]             check this machine: driver, GPUs, NVLink, EFA, NCCL, aws-ofi-nccl,\n"
    "                                         libfabric, FI_/NCCL_ variables, /fsx, /scratch (exit 1 on a failure)\n"
    "  megaengine preprocess --input F ...    jsonl or text -> Megatron .bin/.idx (megaengine preprocess --help)\n"
    "  megaengine checkpoint inspect DIR [--verify]   what a checkpoint holds (and its checksums verified)\n"
    "  megaengine export CKPT --format hf --out DIR   a checkpoint as a Hugging Face transformers model\n"
    "  megaengine import HF_DIR --out CKPT_DIR        a transformers model (LLaMA, GPT-2) as a checkpoint\n"
    "  megaengine plan recipe.lua --nodes N [--gpus-per-node 8] [--gpu h100-80gb]\n"
    "                                         every layout ranked by estimated step time and memory (--help);\n"
    "                                         --plan before a recipe trains with the best (parallel = \"auto\")\n"
    "  megaengine                             open the REPL\n"
    "  megaengine --help | --version\n"
    "\n"
    "environment: ME_LOG_LEVEL=trace|debug|info|warn|error, ME_ASSET_DIR, ME_HISTORY\n";

int die(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "megaengine: %s\n", message.c_str());
  return 1;
}


// `megaengine NAME ...`: the commands that are not a recipe run. Each gets the arguments after
// its name and returns the exit status.
int doctor_command(int argc, char** argv) {
  try {
    const auto out = me::lua::run_doctor(std::vector<std::string>(argv, argv + argc));
    std::fputs(out.text.c_str(), out.exit_status == 2 ? stderr : stdout);
    return out.exit_status;
  } catch (const std::exception& e) {
    return die(e.what());
  }
}

int preprocess_command(int argc, char** argv) {
#if ME_HAVE_TOKENIZERS
  const char* assets = std::getenv("ME_ASSET_DIR");
  return me::data::preprocess_main(argc, argv, assets ? assets : ME_SOURCE_DIR "/assets");
#else
  (void)argc;
  (void)argv;
  return die("this megaengine was built without its tokenizers (libpcre2-dev and nlohmann-json3-dev were not "
             "found at configure time): install them and rebuild to use preprocess");
#endif
}

struct Subcommand {
  const char* name;
  int (*run)(int argc, char** argv);
};

const Subcommand kSubcommands[] = {
    {"doctor", doctor_command},
    {"preprocess", preprocess_command},
    {"checkpoint", me::lua::checkpoint_main},
    {"export", me::lua::export_main},
    {"import", me::lua::import_main},
    {"plan", me::lua::plan_main},
};

const Subcommand* find_subcommand(const std::string& name) {
  for (const auto& sub : kSubcommands)
    if (name == sub.name) return &sub;
  return nullptr;
}

// Bad command-line usage: exit status 2, as docs/cluster.md says (1 is an error of the run).
int usage(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "megaengine: %s\n", message.c_str());
  return me::kExitUsage;
}

}  // namespace

// argv without "--nproc N", run again once per rank by the launcher.
int launch_ranks(int nproc, int argc, char** argv) {
  if (std::getenv("ME_LAUNCHED"))
    return die("--nproc given inside a rank that megaengine --nproc started (ME_LAUNCHED is set)");
  me::launch::LaunchOptions opts;
  opts.nproc = nproc;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  opts.argv.push_back(n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv[0]));
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--nproc") {
      ++i;
      continue;
    }
    opts.argv.push_back(argv[i]);
  }
  return me::launch::launch(opts);
}

int main(int argc, char** argv) {
  // CPU steps free and reallocate large tensors (logits over a 50k vocabulary) every time; by
  // default glibc maps and unmaps each one, and the page faults cost as much as the math.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  std::vector<std::string> chunks;
  int nproc = 0;
  std::string recipe;
  std::vector<std::string> rest;
  bool interactive = false, dry_run = false, plan_layout = false;
  me::lua::RunFileOptions file_options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    // The dry run's flags come before or after the recipe (an override never starts with "--").
    if (a == "--world" || a == "--gpus-per-node") {
      const long v = me::positive_count(i + 1 < argc ? argv[i + 1] : nullptr);
      if (v == 0) return usage(a + " needs a positive number of GPUs, got '" + (i + 1 < argc ? argv[i + 1] : "") + "'");
      (a == "--world" ? file_options.world : file_options.gpus_per_node) = static_cast<int>(v);
      ++i;
      continue;
    }
    if (a == "--gpu" || a == "--profile") {  // the dry run's step-time estimate (megaengine plan --help)
      if (i + 1 >= argc) return usage(a + " needs a value, e.g. --gpu h200-141gb");
      (a == "--gpu" ? file_options.gpu : file_options.profile) = argv[++i];
      continue;
    }
    if (a == "--gpu-memory") {
      if (i + 1 >= argc) return usage("--gpu-memory needs a size, e.g. --gpu-memory 80GB");
      file_options.gpu_memory = argv[++i];
      try {
        me::plan::parse_memory_size(file_options.gpu_memory);  // "80" alone is refused, not 80 bytes
      } catch (const std::exception& e) {
        return usage(e.what());
      }
      continue;
    }
    if (a == "--plan") {  // parallel = "auto": the planner's best layout for the job's GPUs
      plan_layout = true;
      continue;
    }
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
      if (i + 1 >= argc) return usage("-e needs a chunk of Lua code: megaengine -e 'print(1)'");
      chunks.push_back(argv[++i]);
    } else if (a == "-i") {
      interactive = true;
    } else if (a == "--dry-run") {
      dry_run = true;

    } else if (a == "--fields") {  // the recipe field reference, from bindings/lua/fields.lua
      me::lua::LuaHost host;
      std::string error;
      const std::string name = i + 1 < argc ? argv[i + 1] : "";
      if (name.find_first_not_of("abcdefghijklmnopqrstuvwxyz_.") != std::string::npos)
        return usage("--fields takes a section name such as parallel or model.llama, got '" + name + "'");
      const std::string section = name.empty() ? "nil" : "'" + name + "'";
      const bool ok = host.run_chunk("print(require('megaengine.fields').describe(" + section + "))", "=fields", &error);
      return ok ? 0 : die(error.substr(0, error.find("\nstack traceback")));
    } else if (a == "--nproc") {
      const long v = me::positive_count(i + 1 < argc ? argv[i + 1] : nullptr);
      if (v == 0 || v > 4096)
        return usage(std::string("--nproc needs a positive number of processes, got '") + (i + 1 < argc ? argv[i + 1] : "") + "'");
      nproc = static_cast<int>(v);
      ++i;
    } else if (const auto* sub = find_subcommand(a); sub && recipe.empty()) {
      // `--nproc N plan --calibrate F`: the calibration's collectives need every rank
      if (nproc > 0 && a == "plan") return launch_ranks(nproc, argc, argv);
      return sub->run(argc - i - 1, argv + i + 1);
    } else if (a.size() > 1 && a[0] == '-') {
      return usage("unknown option '" + a + "' (see megaengine --help)");
    } else {
      recipe = a;
    }
  }

  if (plan_layout) {
    if (recipe.empty()) return usage("--plan needs a recipe: megaengine --plan recipe.lua (or parallel = \"auto\" in it)");
    rest.push_back("parallel.auto=true");
  }
  if (!dry_run && (file_options.world > 0 || !file_options.gpu_memory.empty() || !file_options.gpu.empty() ||
                   !file_options.profile.empty()))
    return usage("--world and --gpu-memory describe the cluster for --dry-run (as do --gpu and --profile); to train on N ranks use --nproc N "
               "(or srun)");
  if (nproc > 0) {
    try {
      return launch_ranks(nproc, argc, argv);
    } catch (const std::exception& e) {
      return die(e.what());
    }
  }
  try {
    me::log::init_from_env();
    me::lua::LuaHost host;
    std::string error;
    // -e code sees `me` as the REPL does (megaengine -e 'print(me.tensor.zeros{2})').
    if (!chunks.empty() && !host.run_chunk("me = require 'megaengine'", "=(command line)", &error)) return die(error);
    for (const auto& c : chunks)
      if (!host.run_chunk(c, "=(command line)", &error)) return die(error);
    int status = 0;
    file_options.dry_run = dry_run;
    file_options.interactive = interactive;
    // Recipes read it to leave out what only training needs (DATA_PATH, the tokenizer files).
    if (dry_run) setenv("ME_DRY_RUN", "1", 1);
    if (!recipe.empty() && !host.run_file(recipe, rest, file_options, &error, &status)) {
      if (!interactive) return die(error);
      std::fprintf(stderr, "megaengine: %s\n", error.c_str());
    }
    if (interactive || (recipe.empty() && chunks.empty())) me::lua::run_repl(host.state());
    if (status != 0) return status;  // a run stopped by a signal (kExitRequeue once saved)
  } catch (const std::exception& e) {
    return die(e.what());
  }
  return 0;
}
