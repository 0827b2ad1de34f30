// A piece of a global tensor that this rank holds, named as in the whole model: what a
// component hands to checkpoints (Transformer::state_tensors, MasterOptimizer::state_tensors)
// so that any layout can save it and any other layout can load it (checkpoint/state.h).
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

namespace me::parallel {

struct StateTensor {
  std::string name;                  // global: "model.blocks.3.attn.qkv.weight", "exp_avg.embedding.weight"
  torch::Tensor tensor;              // this rank's piece: read when saving, written when loading
  std::vector<int64_t> global_shape;
  int64_t dim = -1, start = 0, length = 0;  // its slice along dim of the global tensor (dim -1: whole)
  int64_t flat_start = 0, flat_length = 0;  // its elements within that slice, flattened
  bool save = true;          // this rank writes it (false: a replica that another rank writes)
  bool padded_vocab = false;  // dim 0 is the padded vocabulary (embedding, output layer)
};

}  // namespace me::parallel
