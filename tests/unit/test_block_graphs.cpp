// CUDA graphs of the blocks (train.cuda_graphs, model/block_graphs.h): the gradient buffer's
// side on the CPU, the graphs themselves against eager runs on the GPU.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "engine/core/graph_capture.h"
#include "engine/model/block_graphs.h"
#include "tiny_models.h"

using me::test::ModelWithGrads;
using me::test::tiny_gpt;
using me::test::tiny_llama;

namespace {

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.to(torch::kCPU, torch::kFloat), y = b.to(torch::kCPU, torch::kFloat);
  const double n = y.norm().item<double>();
  return n > 0 ? (x - y).norm().item<double>() / n : x.norm().item<double>();
}

// One step of `micro` micro-batches of `tokens` ([micro, batch, seq]) into the buffer; the losses.
std::vector<double> step(ModelWithGrads& run, const torch::Tensor& tokens) {
  std::vector<double> losses;
  run.grads->begin_step(tokens.size(0));
  for (int64_t m = 0; m < tokens.size(0); ++m) {
    auto loss = run.model->loss(tokens[m], tokens[m].roll(-1, 1));
    loss.backward();
    losses.push_back(loss.item<double>());
    for (auto& p : run.model->parameters()) p.mutable_grad() = torch::Tensor();  // as the trainer does
  }
  run.grads->finish();
  return losses;
}

}  // namespace

TEST_CASE("gradient buffer for CUDA graphs: zeroed each step, every gradient added, captured writes logged", "[model]") {
  const auto c = tiny_gpt();
  ModelWithGrads plain(c, 3, torch::kCPU, torch::kFloat, /*fused=*/true), zeroed(c, 3, torch::kCPU, torch::kFloat, true);
  zeroed.grads->set_zero_each_step(true);
  zeroed.grads->flat().fill_(7.0);  // what a last step left: begin_step clears it
  torch::manual_seed(4);
  const auto tokens = torch::randint(0, c.vocab, {2, 2, c.seq}, torch::kLong);
  const auto a = step(plain, tokens), b = step(zeroed, tokens);
  CHECK(a == b);
  for (size_t i = 0; i < plain.model->parameters().size(); ++i) {
    INFO("parameter " << plain.model->named_parameters()[i].key());
    CHECK(rel(zeroed.grads->view(i), plain.grads->view(i)) < 1e-6);
  }
  // While a graph is captured, a reported write is logged, not counted, and the hooks do nothing.
  auto& grads = *zeroed.grads;
  grads.begin_step(1);
  const auto params = zeroed.model->parameters();
  {
    me::GraphCaptureScope capturing;
    grads.mark_written(params[1]);
    grads.mark_written(params[2]);
  }
  const auto logged = grads.take_captured_writes();
  REQUIRE(logged.size() == 2);
  CHECK(logged[0].is_same(params[1]));
  CHECK(logged[1].is_same(params[2]));
  CHECK(grads.take_captured_writes().empty());
  // A hook (a gradient autograd hands over: the norms') leaves the buffer alone while capturing.
  ModelWithGrads hooked(c, 3, torch::kCPU, torch::kFloat, /*fused=*/false);
  hooked.grads->set_zero_each_step(true);
  hooked.grads->begin_step(1);
  {
    me::GraphCaptureScope capturing;
    hooked.model->loss(tokens[0], tokens[0].roll(-1, 1)).backward();
  }
  CHECK(hooked.grads->flat().abs().sum().item<double>() == 0);
  for (auto& p : hooked.model->parameters()) p.mutable_grad() = torch::Tensor();
  hooked.model->loss(tokens[0], tokens[0].roll(-1, 1)).backward();
  CHECK(hooked.grads->flat().abs().sum().item<double>() > 0);
}

TEST_CASE("CUDA graphs of the blocks are refused where LibTorch has no CUDA", "[model]") {
  if (me::model::block_graphs_built()) return;
  me::model::BlockGraphs graphs({}, 2, {});
  CHECK_THROWS_WITH(graphs.arm(), Catch::Contains("train.cuda_graphs: this build's LibTorch has no CUDA"));
  CHECK_FALSE(graphs.armed());
}

namespace {
// Two copies of a model, one eager, one through CUDA graphs from its second step (captured in the
// second step's first micro-batch, replayed after): every step's losses and main grads agree.
void check_graphs_against_eager(const me::model::TransformerConfig& c, torch::ScalarType dtype, double tolerance) {
  const torch::Device gpu(torch::kCUDA, 0);
  ModelWithGrads eager(c, 7, gpu, dtype, /*fused=*/true), graphed(c, 7, gpu, dtype, /*fused=*/true);
  graphed.grads->set_zero_each_step(true);
  auto* buffer = graphed.grads.get();
  me::model::GraphGradHooks hooks;
  hooks.take_captured_writes = [buffer] { return buffer->take_captured_writes(); };
  hooks.mark_written = [buffer](const torch::Tensor& p) { buffer->mark_written(p); };
  const size_t blocks = graphed.model->block_count();
  auto graphs = std::make_shared<me::model::BlockGraphs>(me::parallel::TensorParallel{}, blocks, hooks);
  graphed.model->set_block_graphs(graphs);
  torch::manual_seed(8);
  const auto tokens = torch::randint(0, c.vocab, {4, 3, 2, c.seq}, torch::kLong).to(gpu);  // steps, micro, batch, seq
  for (int64_t s = 0; s < tokens.size(0); ++s) {
    INFO("step " << s + 1);
    if (s == 1) graphs->arm();
    const auto a = step(eager, tokens[s]), b = step(graphed, tokens[s]);
    for (size_t m = 0; m < a.size(); ++m) CHECK(std::abs(a[m] - b[m]) <= tolerance * std::abs(a[m]));
    for (size_t i = 0; i < eager.model->parameters().size(); ++i) {
      INFO("parameter " << eager.model->named_parameters()[i].key());
      CHECK(rel(graphed.grads->view(i), eager.grads->view(i)) < tolerance);
    }
  }
  CHECK_THAT(graphs->describe(), Catch::Contains(std::to_string(blocks) + " forwards and " + std::to_string(blocks) +
                                                  " backwards captured"));
  graphed.model->set_block_graphs(nullptr);
}
}  // namespace

TEST_CASE("CUDA graphs of the blocks: the same losses and main grads as eager", "[model][gpu]") {
  if (!torch::cuda::is_available()) {
    WARN("no CUDA GPU: checked on the GPU machine");
    return;
  }
  SECTION("GPT, fp32") { check_graphs_against_eager(tiny_gpt(), torch::kFloat, 1e-5); }
  SECTION("LLaMA, fp32") { check_graphs_against_eager(tiny_llama(), torch::kFloat, 1e-5); }
  SECTION("GPT, bf16") { check_graphs_against_eager(tiny_gpt(), torch::kBFloat16, 1e-2); }
  SECTION("LLaMA, bf16, selective recomputation") {
    auto c = tiny_llama();
    c.recompute = "selective";
    check_graphs_against_eager(c, torch::kBFloat16, 1e-2);
  }
}
