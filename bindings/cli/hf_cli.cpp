#include "bindings/cli/hf_cli.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/hf/convert.h"
#include "engine/core/error.h"

namespace me::lua {
namespace {

const char* kExportUsage =
    "usage: megaengine export CHECKPOINT --format hf --out DIR [--dtype fp32|bf16|fp16] [--max-shard-size 5GB] [--force]\n"
    "  CHECKPOINT: a checkpoint directory (its latest iteration) or an iter_N directory, of any layout.\n"
    "  Writes a transformers model directory: config.json (LlamaConfig or GPT2Config), model.safetensors\n"
    "  (or shards of at most --max-shard-size with model.safetensors.index.json), generation_config.json\n"
    "  and the recipe's tokenizer files. --dtype: the weights' dtype (default: the model's; fp32 from the\n"
    "  fp32 master weights of a bf16 run). --force replaces an existing DIR.\n";

const char* kImportUsage =
    "usage: megaengine import HF_DIR --out CHECKPOINT_DIR [--max-shard-size 5GB]\n"
    "  Converts a transformers model directory (LLaMA or GPT-2: config.json, model.safetensors or its\n"
    "  shards with model.safetensors.index.json) into a megaengine checkpoint of weights alone\n"
    "  (iteration 0). Train from it with checkpoint.load = CHECKPOINT_DIR (any layout; a fresh optimizer),\n"
    "  or skip this step: checkpoint.load = \"hf:HF_DIR\".\n";

// "5GB", "500MB", "2GiB", "1000000" -> bytes
uint64_t parse_size(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const std::string unit = end ? end : "";
  double scale = 0;
  for (const auto& [name, s] : {std::pair<const char*, double>{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
                                {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}})
    if (unit == name) scale = s;
  ME_CHECK(end != text.c_str() && scale > 0 && v > 0, "--max-shard-size '", text, "': expected a size such as 5GB, 500MB or 2GiB");
  return static_cast<uint64_t>(v * scale);
}

int usage_error(const char* usage, const std::string& message) {
  std::fprintf(stderr, "megaengine: %s\n%s", message.c_str(), usage);
  return 2;
}

int failure(const std::exception& e) {
  std::fflush(stdout);
  std::fprintf(stderr, "megaengine: %s\n", e.what());
  return 1;
}

// Options of the form --name VALUE and flags; positional arguments into `positional`.
struct Args {
  std::string positional, out, format, dtype, max_shard;
  bool force = false;
  std::string error;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 0; i < argc && a.error.empty(); ++i) {
    const std::string s = argv[i];
    auto value = [&](std::string& into) {
      if (i + 1 >= argc) a.error = s + " needs a value";
      else into = argv[++i];
    };
    if (s == "--out") value(a.out);
    else if (s == "--format") value(a.format);
    else if (s == "--dtype") value(a.dtype);
    else if (s == "--max-shard-size") value(a.max_shard);
    else if (s == "--force") a.force = true;
    else if (s == "-h" || s == "--help") a.error = "help";
    else if (a.positional.empty() && !s.empty() && s[0] != '-') a.positional = s;
    else a.error = "unexpected argument '" + s + "'";
  }
  return a;
}

}  // namespace

int export_main(int argc, char** argv) {
  const auto a = parse(argc, argv);
  if (a.error == "help") return std::fputs(kExportUsage, stdout), 0;
  if (!a.error.empty()) return usage_error(kExportUsage, a.error);
  if (a.positional.empty() || a.out.empty()) return usage_error(kExportUsage, "export needs CHECKPOINT and --out DIR");
  if (a.format != "hf") return usage_error(kExportUsage, "export --format: only 'hf' (Hugging Face transformers) is known, got '" + a.format + "'");
  try {
    hf::ExportOptions o;
    o.dtype = a.dtype;
    o.overwrite = a.force;
    if (!a.max_shard.empty()) o.max_shard_bytes = parse_size(a.max_shard);
    const auto r = hf::export_hf(a.positional, a.out, o);
    std::printf("exported %s as a transformers %s model (%s) to %s: %lld tensors, %.3f GB of weights\n",
                a.positional.c_str(), r.family.c_str(), r.dtype.c_str(), r.dir.c_str(), static_cast<long long>(r.tensors),
                static_cast<double>(r.weight_bytes) / 1e9);
    std::string files;
    for (const auto& f : r.files) files += (files.empty() ? "" : ", ") + f;
    std::printf("  files: %s\n", files.c_str());
    for (const auto& n : r.notes) std::printf("  note: %s\n", n.c_str());
  } catch (const std::exception& e) {
    return failure(e);
  }
  return 0;
}

int import_main(int argc, char** argv) {
  const auto a = parse(argc, argv);
  if (a.error == "help") return std::fputs(kImportUsage, stdout), 0;
  if (!a.error.empty()) return usage_error(kImportUsage, a.error);
  if (a.positional.empty() || a.out.empty()) return usage_error(kImportUsage, "import needs HF_DIR and --out CHECKPOINT_DIR");
  if (!a.format.empty() && a.format != "hf") return usage_error(kImportUsage, "import --format: only 'hf' is known");
  if (!a.dtype.empty() || a.force) return usage_error(kImportUsage, "import keeps the weights' dtype; --dtype and --force are export options");
  try {
    hf::ImportOptions o;
    if (!a.max_shard.empty()) o.max_shard_bytes = parse_size(a.max_shard);
    const auto r = hf::import_hf(a.positional, a.out, o);
    std::printf("imported %s into %s: %s, %lld tensors, %.3f GB (weights only: training from it starts a fresh optimizer)\n",
                a.positional.c_str(), r.iteration_dir.c_str(), r.config.describe().c_str(),
                static_cast<long long>(r.tensors), static_cast<double>(r.bytes) / 1e9);
    for (const auto& u : r.unused) std::printf("  note: tensor '%s' has no place in the model and was left out\n", u.c_str());
  } catch (const std::exception& e) {
    return failure(e);
  }
  return 0;
}

}  // namespace me::lua
