// The layout planner (engine/plan/device_profile.h, step_time.h, layout_search.h): profiles and
// their errors, the time model's arithmetic on a flat profile whose terms can be written down
// by hand, and the enumeration with its refusals.
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/core/error.h"
#include "engine/plan/device_profile.h"
#include "engine/plan/layout_search.h"
#include "engine/plan/step_time.h"
#include "tests/unit/plan_fixture.h"

using me::plan::Collective;
using me::plan::DeviceProfile;
using me::plan::MemoryPlan;
using me::model::TransformerConfig;
using me::plan::test::plan_of;

namespace {

// Every speed constant: GEMMs at 1 TFLOP/s, attention at 0.5, 1000 GB/s of memory, 100 GB/s
// links with no latency and no launch cost, TP exposure 1 and DP exposure 0.5.
DeviceProfile flat() {
  DeviceProfile p;
  p.name = "flat", p.gpu = "test", p.source = "test";
  p.memory_bytes = 80e9;
  p.matmul_tflops = 1;
  p.gemm_efficiency.points = {{1, 1.0}};
  p.gemm_launch_us = 1e-9;
  p.attention_tflops.points = {{1, 0.5}};
  p.memory_gbps = 1000;
  for (auto* l : {&p.intra_node, &p.inter_node}) {
    l->all_gather.points = l->reduce_scatter.points = l->all_reduce.points = l->send_recv.points = {{1, 100}};
    l->latency_us = 1e-9;
  }
  p.inter_node.all_gather.points = p.inter_node.reduce_scatter.points = {{1, 10}};
  p.tp_exposed = {{2, 1.0}, {4, 1.0}};
  p.dp_exposed = 0.5;
  return p;
}

TransformerConfig tiny() {
  auto c = TransformerConfig::gpt();
  c.vocab = 256, c.seq = 32, c.layers = 4, c.hidden = 64, c.heads = 4;
  return c;
}


}  // namespace

TEST_CASE("profile curves interpolate in log(x) and clamp at their ends", "[planner]") {
  me::plan::Curve c;
  c.points = {{1e6, 10}, {1e8, 30}};
  CHECK(c.at(1e3) == 10);
  CHECK(c.at(1e9) == 30);
  CHECK(c.at(1e7) == Approx(20));  // halfway in log(x)
  CHECK(flat().tp_exposed_at(1) == 0);
  DeviceProfile p = flat();
  p.tp_exposed = {{2, 1.0}, {8, 4.0}};
  CHECK(p.tp_exposed_at(4) == Approx(2.5));
}

TEST_CASE("built-in profiles parse and round-trip through JSON", "[planner]") {
  const auto names = me::plan::builtin_profile_names();
  REQUIRE(names.size() >= 2);
  for (const auto& name : names) {
    const auto p = me::plan::builtin_profile(name);
    CHECK(p.name == name);
    CHECK(p.memory_bytes > 0);
    const auto again = me::plan::parse_profile(me::plan::profile_to_json(p), "round trip");
    CHECK(again.matmul_tflops == p.matmul_tflops);
    CHECK(again.intra_node.all_gather.points == p.intra_node.all_gather.points);
    CHECK(again.tp_exposed == p.tp_exposed);
    CHECK(again.host_layer_ms == p.host_layer_ms);
  }
  auto host = flat();
  host.host_layer_ms = {{1, 0.5}, {4, 3.0}};
  host.host_layer_ms_no_sp = {{4, 2.0}};
  host.host_micro_ms = {{1, 0.7}, {4, 1.9}};
  host.tp_exposed_no_sp = {{2, 1.5}, {4, 1.1}};
  const auto again = me::plan::parse_profile(me::plan::profile_to_json(host), "round trip");
  CHECK(again.host_layer_ms == host.host_layer_ms);
  CHECK(again.tp_exposed_no_sp == host.tp_exposed_no_sp);
  CHECK(again.host_layer_ms_no_sp == host.host_layer_ms_no_sp);
  CHECK(again.host_micro_ms == host.host_micro_ms);
  CHECK_THROWS_WITH(me::plan::builtin_profile("a100"), Catch::Contains("not a known profile") && Catch::Contains("h100-80gb"));
}

TEST_CASE("a bad profile names the field and what it expects", "[planner]") {
  auto json = me::plan::profile_to_json(flat());
  CHECK_THROWS_WITH(me::plan::parse_profile("{", "p.json"), Catch::Contains("p.json: not valid JSON"));
  auto without = [&](const std::string& key) {
    const auto at = json.find("\"" + key + "\"");
    REQUIRE(at != std::string::npos);
    std::string s = json;
    s.replace(at, key.size() + 2, "\"x_" + key + "\"");
    return s;
  };
  CHECK_THROWS_WITH(me::plan::parse_profile(without("matmul_tflops"), "p.json"),
                    Catch::Contains("p.json: missing field 'matmul_tflops'"));
  CHECK_THROWS_WITH(me::plan::parse_profile(without("send_recv_gbps"), "p.json"),
                    Catch::Contains("missing field 'inter_node.send_recv_gbps'"));
  std::string descending = json;
  const auto at = descending.find("\"gemm_efficiency\"");
  descending.insert(descending.find('[', at) + 1, "[5, 1.0], ");
  CHECK_THROWS_WITH(me::plan::parse_profile(descending, "p.json"), Catch::Contains("ascending x"));
  std::string bad_host = json;
  bad_host.insert(bad_host.rfind('}'), ", \"host_layer_ms\": {\"0\": 1.5}");
  CHECK_THROWS_WITH(me::plan::parse_profile(bad_host, "p.json"),
                    Catch::Contains("p.json: 'host_layer_ms' maps a tp size >= 1 to a number > 0"));
  std::string bad_factor = json;
  bad_factor.insert(bad_factor.rfind('}'), ", \"compute_in_step\": 7");
  CHECK_THROWS_WITH(me::plan::parse_profile(bad_factor, "p.json"), Catch::Contains("'compute_in_step' must be a number between 0.5 and 2"));
  CHECK_THROWS_WITH(me::plan::load_profile_file("/nonexistent/profile.json"),
                    Catch::Contains("cannot read the profile '/nonexistent/profile.json'"));
}

TEST_CASE("collectives and GEMMs follow nccl-tests' bus bandwidth and the FLOP rate", "[planner]") {
  const auto p = flat();
  // all-gather of 64 MB over 4 ranks at 100 GB/s bus bandwidth: 64e6 x 3/4 / 100e9 s = 0.48 ms
  CHECK(me::plan::collective_ms(p.intra_node, Collective::all_gather, 64e6, 4) == Approx(0.48));
  // all-reduce: twice that
  CHECK(me::plan::collective_ms(p.intra_node, Collective::all_reduce, 64e6, 4) == Approx(0.96));
  CHECK(me::plan::collective_ms(p.intra_node, Collective::send_recv, 64e6, 2) == Approx(0.64));
  CHECK(me::plan::collective_ms(p.intra_node, Collective::all_gather, 64e6, 1) == 0);
  // 2 x 1024^3 FLOPs at 1 TFLOP/s: 2.147 ms (compute-bound: 6 MB at 1000 GB/s is 0.006 ms)
  CHECK(me::plan::gemm_ms(p, 1024, 1024, 1024) == Approx(2.147483648).epsilon(1e-6));
}

TEST_CASE("step time of one GPU: each term as written by hand", "[planner]") {
  const auto p = flat();
  const auto c = tiny();
  auto plan = plan_of(c, 1, 1, 1, 2, 8);  // 4 micro-batches of 2 x 32 = 64 tokens
  const auto t = me::plan::estimate_step_time(plan, p, 8);
  const double T = 64, h = 64, f = 256, V = 256, s = 32, m = 4, L = 4;
  // GEMMs: forward + input gradient + weight gradient = 3 x 2 T (h 3h + h h + h f + f h) per
  // layer, and the output layer's 3 x 2 T V h, at 1e12 FLOP/s
  const double layer_flops = 3 * 2 * T * (h * 3 * h + h * h + 2 * h * f);
  const double output_flops = 3 * 2 * T * V * h;
  CHECK(t.gemm == Approx(m * (L * layer_flops + output_flops) / 1e12 * 1e3).epsilon(1e-6));
  // attention: forward 2 x 2 x T x (s / 2) x heads x head_dim FLOPs, backward 2.5x, at 0.5e12
  CHECK(t.attention == Approx(m * L * 3.5 * 2 * 2 * T * (s / 2) * 4 * 16 / 0.5e12 * 1e3).epsilon(1e-6));
  // other kernels: 2 B x (12 h + 3 f + 3h) per token and layer, the embedding's 3 passes of h
  // and the loss's 4 passes over the logits, at 1000 GB/s
  const double other_bytes = L * T * 2 * (12 * h + 3 * f + 3 * h) + T * h * 2 * 3 + T * V * 2 * 4;
  CHECK(t.other == Approx(m * other_bytes / 1e12 * 1e3).epsilon(1e-6));
  CHECK(t.tp_comm == 0);
  CHECK(t.bubble == 0);
  CHECK(t.dp_comm == 0);
  // AdamW: 30 B per parameter and the gradient norm's 4 B
  const double params = static_cast<double>(c.parameter_count(1));
  CHECK(t.optimizer == Approx(params * 34 / 1e12 * 1e3).epsilon(1e-6));
  CHECK(t.total == Approx(t.gemm + t.attention + t.other + t.optimizer));
  CHECK(t.tokens_per_s == Approx(8 * 32 / (t.total / 1e3)));
  CHECK(t.mfu == Approx(c.flops_per_token(1) * t.tokens_per_s / 1e12 / p.matmul_tflops));
}

TEST_CASE("step time: tensor, pipeline and data parallelism add their terms", "[planner]") {
  const auto p = flat();
  const auto c = tiny();
  const double T = 64, h = 64, bytes = T * h * 2;
  SECTION("tp 2 with sequence parallelism: per layer two all-gathers and two reduce-scatters each way") {
    auto plan = plan_of(c, 2, 2, 1, 2, 8);
    plan.sequence_parallel = true;
    const auto t = me::plan::estimate_step_time(plan, p, 8);
    const double one = bytes * 0.5 / 100e9 * 1e3;  // an all-gather or reduce-scatter over 2 ranks
    CHECK(t.tp_comm == Approx(4 * (4 * 8 * one + 2 * one)).epsilon(1e-6));  // 4 micro-batches; + the output layer's pair
    CHECK_FALSE(t.tp_crosses_nodes);
    // across nodes (1 GPU per node): the inter-node link's 10 GB/s
    const auto across = me::plan::estimate_step_time(plan, p, 1);
    CHECK(across.tp_crosses_nodes);
    CHECK(across.tp_comm == Approx(10 * t.tp_comm).epsilon(1e-6));
  }
  SECTION("pp 2: the bubble is one micro-batch slot of the busiest stage less its weight gradients") {
    auto plan = plan_of(c, 2, 1, 2, 2, 8);
    plan.deferred_wgrads = 0;
    const auto plain = me::plan::estimate_step_time(plan, p, 8);
    const double slot = (plain.gemm + plain.attention + plain.other) / 4;  // 4 micro-batches
    CHECK(plain.bubble == Approx(slot).epsilon(1e-6));
    CHECK(plain.busiest_stage == 1);  // the output layer's stage
    CHECK(plain.pp_comm == Approx(4 * 2 * bytes / 100e9 * 1e3).epsilon(1e-6));
    plan.deferred_wgrads = 1;
    const auto deferred = me::plan::estimate_step_time(plan, p, 8);
    CHECK(deferred.bubble < plain.bubble);
    // fully recomputed blocks run their weight gradients at once: nothing held back into the bubble
    plan.model.recompute = "full";
    const auto full = me::plan::estimate_step_time(plan, p, 8);
    const double full_slot = (full.gemm + full.attention + full.other) / 4;
    CHECK(full.bubble == Approx(full_slot).epsilon(1e-6));
  }
  SECTION("dp 2: the gradient all-reduce, half exposed; the distributed optimizer shards the update") {
    auto plan = plan_of(c, 2, 1, 1, 2, 8);
    const double params = static_cast<double>(c.parameter_count(1));
    const auto t = me::plan::estimate_step_time(plan, p, 8);
    CHECK(t.dp_comm == Approx(0.5 * params * 4 * 2 * 0.5 / 100e9 * 1e3).epsilon(1e-6));
    plan.distributed_optimizer = true;
    const auto d = me::plan::estimate_step_time(plan, p, 8);
    CHECK(d.optimizer == Approx((params / 2 * 30 + params * 4) / 1e12 * 1e3).epsilon(1e-6));
    // reduce-scatter of fp32 gradients + all-gather of bf16 parameters
    CHECK(d.dp_comm == Approx(0.5 * (params * 4 * 0.5 + params * 2 * 0.5) / 100e9 * 1e3).epsilon(1e-6));
  }
  SECTION("full recomputation runs each layer's forward again") {
    auto plan = plan_of(c, 1, 1, 1, 2, 8);
    const auto none = me::plan::estimate_step_time(plan, p, 8);
    plan.model.recompute = "full";
    const auto full = me::plan::estimate_step_time(plan, p, 8);
    CHECK(full.gemm > none.gemm * 1.25);
    CHECK(full.attention == Approx(none.attention * (1 + 1 / 3.5)).epsilon(1e-6));
  }
}

TEST_CASE("step time: in-step compute and the exposure without sequence parallelism", "[planner]") {
  auto p = flat();
  const auto c = tiny();
  auto plan = plan_of(c, 2, 2, 1, 2, 8);
  const auto base = me::plan::estimate_step_time(plan, p, 8);
  p.compute_in_step.points = {{1, 1.25}};
  const auto slower = me::plan::estimate_step_time(plan, p, 8);
  CHECK(slower.gemm == Approx(1.25 * base.gemm));
  CHECK(slower.attention == Approx(1.25 * base.attention));
  CHECK(slower.other == Approx(1.25 * base.other));
  CHECK(slower.tp_comm == Approx(base.tp_comm));
  CHECK(slower.optimizer == Approx(base.optimizer));
  p.tp_exposed_no_sp = {{2, 3.0}};  // all-reduces 3x exposed; SP's gathers keep tp_exposed's 1
  CHECK(me::plan::estimate_step_time(plan, p, 8).tp_comm == Approx(3 * base.tp_comm));
  plan.sequence_parallel = true;
  const auto sp = me::plan::estimate_step_time(plan, p, 8);
  p.tp_exposed_no_sp.clear();
  CHECK(me::plan::estimate_step_time(plan, p, 8).tp_comm == Approx(sp.tp_comm));
  const auto again = me::plan::parse_profile(me::plan::profile_to_json(p), "round trip");
  CHECK(again.compute_in_step_at(64) == 1.25);
  p.compute_in_step.points = {{32, 1.0}, {128, 1.5}};  // by hidden size: 64 is halfway in log
  CHECK(p.compute_in_step_at(64) == Approx(1.25));
  CHECK(me::plan::estimate_step_time(plan, p, 8).gemm == Approx(1.25 * base.gemm));
}

TEST_CASE("step time: a host slower than the GPU sets the micro-batch's slot", "[planner]") {
  auto p = flat();
  const auto c = tiny();
  auto plan = plan_of(c, 2, 2, 1, 2, 8);  // tp 2, 4 micro-batches
  plan.sequence_parallel = true;
  const auto gpu_bound = me::plan::estimate_step_time(plan, p, 8);
  CHECK(gpu_bound.host == 0);  // no measurements: no host term
  const double gpu_slot = (gpu_bound.gemm + gpu_bound.attention + gpu_bound.other + gpu_bound.tp_comm) / 4;
  SECTION("a host faster than the GPU changes nothing") {
    p.host_layer_ms = {{1, 1e-6}, {2, 1e-6}};
    CHECK(me::plan::estimate_step_time(plan, p, 8).total == Approx(gpu_bound.total));
  }
  SECTION("a slower host adds its excess per micro-batch, interpolated by tp, with or without SP") {
    p.host_layer_ms = {{1, 1.0}, {4, 10.0}};  // 5.5 ms at tp 2 (halfway in log(tp))
    const auto t = me::plan::estimate_step_time(plan, p, 8);
    CHECK(p.host_layer_ms_at(2, true) == Approx(5.5));
    CHECK(t.host == Approx(4 * (4 * 5.5 - gpu_slot)).epsilon(1e-6));
    CHECK(t.total == Approx(gpu_bound.total + t.host).epsilon(1e-9));
    CHECK_THAT(me::plan::describe_terms(t), Catch::Contains("host-bound"));
    p.host_micro_ms = {{2, 3.0}};  // the embedding, output layer and loss: once per micro-batch
    CHECK(me::plan::estimate_step_time(plan, p, 8).host == Approx(4 * (4 * 5.5 + 3.0 - gpu_slot)).epsilon(1e-6));
    p.host_micro_ms.clear();
    p.host_layer_ms_no_sp = {{2, 2.0}};
    CHECK(p.host_layer_ms_at(2, false) == 2.0);
    CHECK(p.host_layer_ms_at(2, true) == Approx(5.5));
    CHECK(p.host_layer_ms_at(1, false) == 1.0);  // tp 1 has no SP to tell apart
    plan.model.recompute = "full";  // the forward issued again: a third more
    const auto g = me::plan::estimate_step_time(plan, flat(), 8);
    const double full_gpu_slot = (g.gemm + g.attention + g.other + g.tp_comm) / 4;
    CHECK(me::plan::estimate_step_time(plan, p, 8).host ==
          Approx(4 * (4 * 5.5 * (1 + 1.0 / 3) - full_gpu_slot)).epsilon(1e-6));
  }
  SECTION("in a pipeline the host's slot is the bubble's too") {
    auto piped = plan_of(c, 2, 1, 2, 2, 8);
    p.host_layer_ms = {{1, 100.0}};
    const auto t = me::plan::estimate_step_time(piped, p, 8);
    CHECK(t.bubble == Approx(2 * 100.0));  // pp - 1 slots of 2 layers
    p.host_micro_ms = {{1, 50.0}};          // on the last stage, which becomes the busiest
    const auto last = me::plan::estimate_step_time(piped, p, 8);
    CHECK(last.busiest_stage == 1);
    CHECK(last.bubble == Approx(2 * 100.0 + 50.0));
  }
}

TEST_CASE("the planner enumerates layouts that divide and fit, fastest first", "[planner]") {
  auto c = tiny();
  c.heads = 6, c.hidden = 96;  // 6 heads: tp 4 cannot split them
  me::plan::PlanRequest r;
  r.base = plan_of(c, 1, 1, 1, 2, 16);
  r.nodes = 1, r.gpus_per_node = 4;
  r.profile = flat();
  const auto result = me::plan::search_layouts(r);
  REQUIRE_FALSE(result.fitting.empty());
  CHECK(result.considered == static_cast<int>(result.fitting.size()) + result.over_memory);
  for (size_t i = 0; i < result.fitting.size(); ++i) {
    const auto& cand = result.fitting[i];
    CHECK(cand.plan.tp != 4);
    CHECK(cand.plan.world == 4);
    CHECK(cand.plan.global() == 16);
    CHECK(cand.memory <= result.capacity);
    if (i > 0) CHECK(cand.time.total >= result.fitting[i - 1].time.total);
  }
  CHECK(result.fitting.front().overrides.front().rfind("parallel.tp=", 0) == 0);
  const auto report = me::plan::plan_report(r, result, 3, 1000);
  CHECK_THAT(report, Catch::Contains("#1  tp ") && Catch::Contains("#3  ") && Catch::Contains("why #1:") &&
                         Catch::Contains("days for 1000 samples"));

  SECTION("a global batch of 0 is pinned to the recipe's micro x dp") {
    r.base.global_batch = 0;
    r.base.micro_batch = 2;
    const auto pinned = me::plan::search_layouts(r);
    CHECK(pinned.fitting.front().plan.global() == 8);
    CHECK_THAT(pinned.fitting.front().overrides.back(), Catch::Equals("batch.global=8"));
  }
}

TEST_CASE("a model that fits no layout: the largest term and what would fit", "[planner]") {
  me::plan::PlanRequest r;
  auto c = TransformerConfig::llama();
  c.vocab = 32000, c.seq = 4096, c.layers = 80, c.hidden = 8192, c.heads = 64, c.query_groups = 8,
  c.ffn_multiplier = 1.3, c.ffn_multiple_of = 4096;
  r.base = plan_of(c, 1, 1, 1, 1, 64);
  r.nodes = 1, r.gpus_per_node = 8;
  r.profile = me::plan::builtin_profile("h100-80gb");
  CHECK_THROWS_WITH(me::plan::best_layout(r), Catch::Contains("no layout of LLaMA(layers=80") &&
                                                  Catch::Contains("fits 1 node of 8 GPUs with 80.0 GB each") &&
                                                  Catch::Contains("the largest term is") &&
                                                  Catch::Contains("it would fit on") && Catch::Contains("nodes of 8 GPUs"));
  r.nodes = 4;
  const auto best = me::plan::best_layout(r);
  CHECK(best.plan.tp <= 8);
  CHECK(best.memory <= 80e9);
}
