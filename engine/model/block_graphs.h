// CUDA graphs of the transformer blocks (train.cuda_graphs): each block's forward and backward
// of a micro-batch captured once and replayed after, so that the host launches one graph per
// block where it launched a few hundred kernels, copies and events. At tp 4 the host's launches
// pace the step (bench/RESULTS.md, thirty-third session: each host busy 88-94 ms of a 102 ms step
// at the GPT-39B width); a replay costs the host a few microseconds.
//
// The recipe is torch.cuda.make_graphed_callables' on the engine's own pieces:
// - the blocks are captured in the order they run (forwards, then backwards in reverse) into one
//   memory pool, and replayed in that order, so memory freed inside one capture and taken by a
//   later one is never in use by both;
// - each block has static inputs and output gradients: a block's input is the previous block's
//   static output (same memory, nothing copied), the first block's is copied in, and likewise
//   the output gradients backward;
// - a replay cannot choose between writing a main grad and adding to it: the gradient buffer is
//   zeroed at each step's start and every weight-gradient GEMM adds (GradBuffer::
//   set_zero_each_step); the main grads a backward writes are logged while it is captured and
//   reported after each replay, so the buckets' reductions start as they do eagerly; gradients
//   that are not main grads (the norms') are the graph's outputs, handed to autograd;
// - the copy engines' collectives inside a capture meet at barriers, which the GPU counts, not at
//   signals, which the host counts; a replay takes the peer buffers' slots it was captured with
//   (a barrier first where the host's count has the other parity);
// - the first step runs eagerly (cuBLASLt's plans, cached tables and workspaces are made there,
//   not inside a capture); the captures happen in the second step's first micro-batch, each
//   followed by its replay, which computes that micro-batch.
// Refused up front by the recipe's check (a dry run too): a CPU, fp8, full recomputation, pipeline
// parallelism, a tensor-parallel group without the copy engines' sequence-parallel collectives;
// by the trainer: a build without CUDA, copy engines that did not open.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/transformer.h"

namespace me::model {

// What the graphs need from the gradient buffer (parallel::GradBuffer), unset without one.
struct GraphGradHooks {
  // The parameters whose main grads the work captured since the last call writes.
  std::function<std::vector<torch::Tensor>()> take_captured_writes;
  // That a parameter's main grad holds this micro-batch's gradient.
  std::function<void(const torch::Tensor&)> mark_written;
};

class BlockGraphs {
 public:
  BlockGraphs(const TensorParallel& tp, size_t blocks, GraphGradHooks hooks);
  ~BlockGraphs();
  BlockGraphs(const BlockGraphs&) = delete;
  BlockGraphs& operator=(const BlockGraphs&) = delete;

  // From the next forward with autograd on, the blocks run through their graphs (captured first).
  void arm();
  bool armed() const;
  // Block i of the stage: through its graphs when armed and autograd is on, else eagerly.
  Residual forward(size_t i, BlockImpl& block, const Residual& in);
  // "4 blocks: 4 forwards and 4 backwards captured (1234 MiB in their memory pool)".
  std::string describe() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Whether this build can capture CUDA graphs (a LibTorch with CUDA).
bool block_graphs_built();

}  // namespace me::model
