// A checkpoint's metadata.json: what was saved and how it is cut. Each tensor is named as in the
// whole, unsplit model ("model.blocks.17.mlp.fc2.weight", "exp_avg.embedding.weight") with its
// global shape; each piece of it says which shard file holds it and which slice: along `dim`
// (tensor-parallel layers) the range [start, start + length), and within that slice, flattened,
// the elements [flat_start, flat_start + flat_length) (the distributed optimizer's share of a
// parameter). That is enough to load the checkpoint into any other layout. Torch-free; JSON
// stays inside metadata.cpp.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/config/recipe.h"

namespace me::checkpoint {

struct Piece {
  std::string file;  // shard file name in the iteration directory
  std::string key;   // the tensor's name in that file
  int64_t dim = -1;  // the dimension the global tensor is split along; -1: not split
  int64_t start = 0, length = 0;            // the slice along dim (the whole tensor when dim = -1)
  int64_t flat_start = 0, flat_length = 0;  // elements inside that slice, flattened
};

struct TensorRecord {
  std::string dtype;  // safetensors' name: F32, BF16, ...
  std::vector<int64_t> shape;
  std::vector<Piece> pieces;
};

struct ShardRecord {
  int rank = 0;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

struct Layout {
  int64_t world = 1, tp = 1, pp = 1, dp = 1;
  std::vector<int64_t> stage_layers;  // layers of each pipeline stage
  bool distributed_optimizer = false;
  std::string precision;
};

struct Metadata {
  static constexpr int64_t kFormatVersion = 1;
  int64_t version = kFormatVersion;
  int64_t iteration = 0, consumed_samples = 0, skipped = 0, nan = 0;
  int64_t optimizer_steps = 0;
  double loss_scale = 0;  // fp16's dynamic loss scaler; 0: none
  int64_t loss_scale_good_steps = 0, loss_scale_hysteresis_left = 0;
  int64_t vocab = 0;        // the real vocabulary (the model's tensors hold the padded one)
  std::string recipe_json;  // the resolved recipe
  Layout layout;
  std::map<std::string, TensorRecord> tensors;
  std::map<std::string, ShardRecord> shards;

  std::string to_json() const;
  // me::Error naming `file` for what is not a checkpoint's metadata, or a newer format version.
  static Metadata parse(const std::string& text, const std::string& file);
  // Adds another rank's tensors (their pieces), checking that dtypes and shapes agree.
  void merge_tensors(const Metadata& other);
};

// The resolved recipe as JSON (every field, by the names fields.lua gives them), and back: the
// fields a checkpoint's reader needs (the model, the tokenizer, the precision and the name).
std::string recipe_to_json(const config::Recipe& spec);
config::Recipe recipe_from_json(const std::string& json, const std::string& file);

}  // namespace me::checkpoint
