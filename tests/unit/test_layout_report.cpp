// The dry run's layout table (engine/plan/layout_report.h) and its reports
// (engine/plan/memory_report.h) on the user's two layouts.
#include <catch2/catch.hpp>

#include "engine/plan/layout_report.h"
#include "engine/plan/memory_report.h"

using me::comm::RankGrid;

TEST_CASE("rank ranges fold consecutive ranks", "[layout]") {
  CHECK(me::plan::rank_ranges({0, 1, 2, 3}) == "0-3");
  CHECK(me::plan::rank_ranges({0, 8}) == "0,8");
  CHECK(me::plan::rank_ranges({0, 1, 4, 5, 6}) == "0,1,4-6");
  CHECK(me::plan::rank_ranges({7}) == "7");
}

TEST_CASE("the layout table: tp 4 x pp 2 x dp 2 on two nodes of 8", "[layout]") {
  const RankGrid grid(16, 4, 2);
  CHECK(me::plan::tp_inside_nodes(grid, 8));
  const auto t = me::plan::describe_layout(grid, 8);
  CHECK_THAT(t, Catch::Contains("layout: 16 GPUs = tp 4 x pp 2 x dp 2 on 2 nodes of 8 GPUs"));
  // Megatron's order: tp groups are adjacent ranks, dp pairs 4 apart, pipeline stages 8 apart
  // (the two stages of a pipeline on different nodes).
  CHECK_THAT(t, Catch::Contains("tp groups (4 x 4 ranks): {0-3} node 0 | {4-7} node 0 | {8-11} node 1 | {12-15} node 1"));
  CHECK_THAT(t, Catch::Contains("pp groups (8 x 2 ranks): {0,8} nodes 0,1 |"));
  CHECK_THAT(t, Catch::Contains("dp groups (8 x 2 ranks): {0,4} node 0 | {1,5} node 0"));
  CHECK_THAT(t, Catch::Contains("every tp group is inside one node"));
  CHECK(t.find("more") == std::string::npos);  // all groups shown
}

TEST_CASE("tensor parallelism wider than a node is flagged", "[layout]") {
  const RankGrid grid(16, 16, 1);
  CHECK_FALSE(me::plan::tp_inside_nodes(grid, 8));
  CHECK_THAT(me::plan::describe_layout(grid, 8), Catch::Contains("WARNING: tp 16 is larger than a node's 8 GPUs"));
  // Also when tp does not divide the node: tp 3 on nodes of 8 puts ranks 6-8 on two nodes.
  CHECK_FALSE(me::plan::tp_inside_nodes(RankGrid(24, 3, 1), 8));
  CHECK_THAT(me::plan::describe_layout(RankGrid(64, 1, 1), 8, 2), Catch::Contains("tp 1: none"));
  CHECK_THAT(me::plan::describe_layout(RankGrid(64, 2, 1), 8, 2), Catch::Contains("| ... 30 more"));
}

namespace {
// The user's 39.1B row (recipes/gpt39b.lua): 48 layers, hidden 8192, 64 heads, seq 2048.
me::config::Recipe gpt39b() {
  me::config::Recipe s;
  s.device = "cuda";
  s.precision = "bf16";
  s.model = me::model::TransformerConfig::gpt();
  s.model.vocab = 50257, s.model.seq = 2048, s.model.layers = 48, s.model.hidden = 8192, s.model.heads = 64;
  s.parallel.tp = 4, s.parallel.pp = 2, s.parallel.distributed_optimizer = true;
  s.batch.micro = 1, s.batch.global = 288;
  // fields.lua's defaults (a config::Recipe made in C++ has none)
  s.parallel.pp_split = "even", s.parallel.grad_reduce_dtype = "fp32", s.parallel.symmetric_buffers = "none";
  s.parallel.pp_deferred_wgrads = 1, s.parallel.grad_accumulation_fusion = true;
  s.optim.kind = "adamw";
  return s;
}
}  // namespace

TEST_CASE("the dry run of the 39.1B recipe at 16 GPUs", "[layout]") {
  me::plan::DryRunOptions o;
  o.world = 16;
  const auto r = me::plan::dry_run_report(gpt39b(), o);
  // 48 x (12 h^2 + 13 h) + 50688 x 8192 (vocabulary padded to 512 at tp 4) + 2048 x 8192 + 2h
  CHECK_THAT(r, Catch::Contains("parameters: 39,091,847,168 (39.09B) in the model"));
  CHECK_THAT(r, Catch::Contains("pipeline stage 1 of 2: layers 0-23 + embeddings"));
  CHECK_THAT(r, Catch::Contains("every tp group is inside one node"));
  CHECK_THAT(r, Catch::Contains("verdict: fits"));
  CHECK_THAT(r, Catch::Contains("(without the distributed optimizer)"));
  // Without the distributed optimizer the same layout does not fit, and sharding is the fix.
  auto s = gpt39b();
  s.parallel.distributed_optimizer = false;
  const auto bad = me::plan::dry_run_report(s, o);
  CHECK_THAT(bad, Catch::Contains("verdict: does NOT fit"));
  CHECK_THAT(bad, Catch::Contains("smallest change that fits"));
  CHECK_THAT(bad, Catch::Contains("parallel.distributed_optimizer=true"));
}

TEST_CASE("an out-of-memory report explains the running layout", "[layout]") {
  auto s = gpt39b();
  s.parallel.tp = 1, s.parallel.pp = 1;
  // LibTorch 2.x's message: the first sentences stay, the capacity comes from it, the allocator's
  // statistics and advice go.
  const std::string what =
      "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.23 GiB is "
      "free. Including non-PyTorch memory, this process has 77.9 GiB memory in use. Of the allocated memory 75.1 GiB "
      "is allocated by PyTorch, and 1.2 GiB is reserved by PyTorch but unallocated. If reserved but unallocated "
      "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\nException raised from malloc";
  const auto r = me::plan::oom_report(s, 16, 3, 0, what);
  CHECK_THAT(r, Catch::StartsWith("CUDA out of memory on rank 3 (Tried to allocate 2.00 GiB. GPU 0 has a total "
                                  "capacity of 79.19 GiB of which 1.23 GiB is free)."));
  CHECK_THAT(r, Catch::Contains("more than 85.0 GB"));  // 79.19 GiB
  CHECK_THAT(r, Catch::Contains("verdict: does NOT fit"));
  CHECK_THAT(r, Catch::Contains("parallel.tp="));
  CHECK(r.find("Exception raised from") == std::string::npos);
  // A run the estimate says fits, which still ran out: something outside the estimate, and a
  // change that needs a tenth less.
  const auto fits = me::plan::oom_report(gpt39b(), 16, 0, 80e9, "CUDA out of memory. Tried to allocate 1.00 GiB.");
  CHECK_THAT(fits, Catch::Contains("the estimate fits, so something it does not count took the rest"));
  CHECK_THAT(fits, Catch::Contains("a change that needs a tenth less: "));
}

TEST_CASE("a model too large for the GPUs asks for more of them", "[layout]") {
  // LLaMA-2 70B on 4 GPUs: no layout of 4 fits 80 GB; on 16, tp 8 x pp 2 with full recomputation
  // and bf16 gradients does (16 B x 68.98B / 16 = 69 GB of weights, gradients and optimizer state).
  me::plan::MemoryPlan p;
  p.model = me::model::TransformerConfig::llama();
  p.model.layers = 80, p.model.hidden = 8192, p.model.heads = 64, p.model.query_groups = 8, p.model.seq = 4096;
  p.model.ffn_multiplier = 1.3, p.model.ffn_multiple_of = 4096;
  p.world = 4, p.micro_batch = 1, p.global_batch = 64, p.precision = "bf16";
  const auto r = me::plan::memory_report(p, 80e9, 8);
  CHECK_THAT(r, Catch::Contains("fits on 4 GPUs; on 16 GPUs (--world 16): parallel.tp=8 parallel.pp=2"));
  CHECK_THAT(r, Catch::Contains("model.recompute=full"));
}
