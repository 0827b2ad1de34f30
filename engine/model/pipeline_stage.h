// How a model's layers are cut into pipeline stages, as plain data (no LibTorch): the model
// builds its stage from it, and the dry run and memory estimate (memory_estimate.h) count
// each stage's parameters and activations without building anything.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/model/transformer_config.h"

namespace me::model {

// Which pipeline stage a model is: stage `index` of `count` holds consecutive layers (an even
// share, or first_layers / last_layers on the end stages); the first stage also holds the
// embeddings, the last the final norm and the output layer (and, with tied embeddings, its own
// copy of the word embedding, kept equal to the first stage's by summing their gradients, as
// Megatron does).
struct PipelineStage {
  int index = 0, count = 1;
  // Layers of the first and of the last stage; 0: the same share as the stages in between get.
  // The embedding and the output layer make those two stages heavier (Megatron's
  // --decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers).
  int64_t first_layers = 0, last_layers = 0;
  bool first() const { return index == 0; }
  bool last() const { return index == count - 1; }
  bool whole() const { return count == 1; }
  // The number of layers of every stage in a model of `layers`; a clear error when the layers
  // cannot be split that way.
  std::vector<int64_t> stage_layers(int64_t layers) const;
  // {first layer, number of layers} of this stage.
  std::pair<int64_t, int64_t> layer_range(int64_t layers) const;
};

// {first, last} stages' layers (PipelineStage::first_layers, last_layers) that even out the
// stages' model FLOPs, the last stage's output layer counted (parallel.pp_split = "balanced"):
// of the splits stage_layers accepts, the one whose busiest stage has the least work. {0, 0}
// when the layers cannot fill `stages` stages.
std::pair<int64_t, int64_t> balanced_stage_split(const TransformerConfig& config, int stages, int tp = 1);

}  // namespace me::model
