#include "bindings/cli/checkpoint_cli.h"

#include <cstdio>
#include <map>
#include <string>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/state.h"
#include "engine/core/error.h"
#include "engine/core/files.h"

namespace me::lua {
namespace {

const char* kUsage =
    "usage: megaengine checkpoint inspect DIR [--verify]\n"
    "  DIR: a checkpoint directory (its latest iteration) or one of its iter_N directories.\n"
    "  Prints the iterations a checkpoint directory holds (checkpoint.iteration=N resumes from an earlier\n"
    "  one), then the iteration inspected, the layout that saved it, every tensor with its dtype and\n"
    "  shape, and the total size; --verify also checks every shard's size and CRC-32C.\n";

int64_t tensor_bytes(const checkpoint::TensorRecord& t) {
  int64_t n = 1;
  for (const int64_t d : t.shape) n *= d;
  const auto dtype = checkpoint::parse_dtype(t.dtype);
  return dtype ? n * static_cast<int64_t>(checkpoint::dtype_size(*dtype)) : 0;
}

void print_inspection(checkpoint::CheckpointReader& reader) {
  const auto& m = reader.metadata();
  const auto& l = m.layout;
  const auto recipe = checkpoint::recipe_from_json(m.recipe_json, reader.path());
  std::printf("checkpoint %s (format version %lld)\n", reader.path().c_str(), static_cast<long long>(m.version));
  std::printf("  iteration %lld, consumed samples %lld, optimizer steps %lld, skipped %lld\n",
              static_cast<long long>(m.iteration), static_cast<long long>(m.consumed_samples),
              static_cast<long long>(m.optimizer_steps), static_cast<long long>(m.skipped));
  std::printf("  run '%s': %s, %s\n", recipe.name.c_str(), recipe.model.describe().c_str(), l.precision.c_str());
  std::string stages;
  for (const int64_t n : l.stage_layers) stages += (stages.empty() ? "" : "/") + std::to_string(n);
  std::printf("  saved at world %lld = tp %lld x pp %lld x dp %lld%s; pipeline stages of %s layers\n",
              static_cast<long long>(l.world), static_cast<long long>(l.tp), static_cast<long long>(l.pp),
              static_cast<long long>(l.dp), l.distributed_optimizer ? " with the distributed optimizer" : "",
              stages.c_str());
  uint64_t shard_bytes = 0;
  for (const auto& [file, s] : m.shards) shard_bytes += s.bytes;
  std::printf("  %zu shard files, %.3f GB\n", m.shards.size(), static_cast<double>(shard_bytes) / 1e9);
  std::printf("  %zu tensors:\n", m.tensors.size());
  int64_t total = 0;
  for (const auto& [name, t] : m.tensors) {
    std::printf("    %-48s %-5s %-22s %zu piece%s\n", name.c_str(), t.dtype.c_str(),
                checkpoint::shape_text(t.shape).c_str(),
                t.pieces.size(), t.pieces.size() == 1 ? "" : "s");
    total += tensor_bytes(t);
  }
  std::printf("  total %.3f GB of tensors\n", static_cast<double>(total) / 1e9);
}

// A checkpoint directory: the iterations it holds, so that an earlier one can be chosen
// (checkpoint.iteration=N) when the latest is damaged.
void print_iterations(const std::string& dir) {
  if (files::exists(files::join(dir, checkpoint::kMetadataFile))) return;  // an iter_N directory
  const checkpoint::CheckpointDir d(dir);
  const auto all = d.committed();
  if (all.empty()) return;
  std::string tracker = "no tracker";
  try {
    if (const auto latest = d.latest()) tracker = "the latest: " + std::to_string(*latest);
  } catch (const std::exception& e) {
    tracker = "its tracker is damaged";
  }
  std::printf("checkpoint directory %s: iterations %s (%s)\n", dir.c_str(), checkpoint::iteration_list(all).c_str(),
              tracker.c_str());
}

}  // namespace

int checkpoint_main(int argc, char** argv) {
  std::string dir;
  bool verify = false;
  if (argc < 1 || std::string(argv[0]) != "inspect") {
    std::fputs(kUsage, stderr);
    return 2;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--verify") verify = true;
    else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (dir.empty() && a[0] != '-') dir = a;
    else {
      std::fprintf(stderr, "megaengine checkpoint: unexpected argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (dir.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  try {
    print_iterations(dir);
    checkpoint::CheckpointReader reader(checkpoint::resolve_iteration_dir(dir));
    print_inspection(reader);
    if (verify) {
      reader.verify_all();
      std::printf("  verified: every shard has its recorded size and CRC-32C\n");
    }
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "megaengine: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace me::lua
