#include <catch2/catch.hpp>

#include <ATen/Parallel.h>

#include <cmath>
#include <memory>
#include <set>
#include <tuple>

#include "engine/core/torch_compat.h"
#include "engine/model/transformer.h"
#include "engine/parallel/collective_matmul.h"
#include "engine/parallel/symmetric_slots.h"
#include "engine/parallel/grad_buffer.h"
#include "tiny_models.h"

using me::model::Transformer;
using me::model::TransformerConfig;
using me::test::ModelWithGrads;
using me::test::tiny_gpt;
using me::test::tiny_llama;


TEST_CASE("parameter count: the formula equals the module", "[model]") {
  for (auto c : {tiny_gpt(), tiny_llama()}) {
    for (bool tied : {true, false}) {
      c.tie_embeddings = tied;
      Transformer m(c);
      INFO(c.describe() << (tied ? " tied" : " untied"));
      CHECK(m->local_parameter_count() == c.parameter_count());
    }
  }
  auto c = tiny_gpt();
  const int64_t h = 32, f = 128, L = 3, V = 97, S = 24;
  CHECK(c.parameter_count() == V * h + S * h + L * (4 * h * h + 2 * h * f + 9 * h + f) + 2 * h);
}

TEST_CASE("LLaMA sizes: the FFN rule and the published parameter counts", "[model]") {
  auto llama = [](int64_t layers, int64_t hidden, int64_t heads, int64_t groups, double mult, int64_t multiple_of) {
    auto c = TransformerConfig::llama();
    c.layers = layers;
    c.hidden = hidden;
    c.heads = heads;
    c.query_groups = groups;
    c.ffn_multiplier = mult;
    c.ffn_multiple_of = multiple_of;
    c.seq = 4096;
    return c;
  };
  auto b7 = llama(32, 4096, 32, 0, 1.0, 256), b13 = llama(40, 5120, 40, 0, 1.0, 256),
       b70 = llama(80, 8192, 64, 8, 1.3, 4096);
  CHECK(b7.ffn() == 11008);
  CHECK(b13.ffn() == 13824);
  CHECK(b70.ffn() == 28672);
  CHECK(std::abs(b7.parameter_count() / 6.74e9 - 1.0) < 0.005);
  CHECK(std::abs(b13.parameter_count() / 13.0e9 - 1.0) < 0.005);
  CHECK(std::abs(b70.parameter_count() / 68.98e9 - 1.0) < 0.005);
}

TEST_CASE("the vocabulary is padded to a multiple of 128 x tp, as Megatron does", "[model]") {
  auto c = TransformerConfig::gpt();
  c.vocab = 50257;
  CHECK(c.padded_vocab(1) == 50304);
  CHECK(c.padded_vocab(2) == 50432);
  CHECK(c.padded_vocab(4) == 50688);
}

TEST_CASE("forward shapes and the initial loss", "[model]") {
  for (auto c : {tiny_gpt(), tiny_llama()}) {
    Transformer m(c);
    m->reset_parameters(3);
    auto tokens = torch::randint(0, 97, {2, 24}, torch::kLong);
    auto logits = m->forward(tokens);
    REQUIRE(logits.sizes() == torch::IntArrayRef({2, 24, 97}));
    // Small init: predictions start near uniform, loss near ln(vocab).
    const double loss = m->loss(tokens, torch::randint(0, 97, {2, 24}, torch::kLong)).item<double>();
    CHECK(std::abs(loss - std::log(97.0)) < 0.3);
    CHECK_THROWS_WITH(m->forward(torch::zeros({1, 25}, torch::kLong)), Catch::Contains("longer than model.seq = 24"));
  }
}

TEST_CASE("forward_stage announces every parameter it uses before use (the overlapped parameter gather)", "[model]") {
  // The distributed optimizer's overlapped all-gather waits only where the model announces a
  // part: a parameter never announced would be read while its bucket may still be in flight.
  auto untied = tiny_gpt();
  untied.tie_embeddings = false;
  for (auto c : {tiny_gpt(), untied, tiny_llama()})
    for (auto stage : {me::model::PipelineStage{0, 1}, me::model::PipelineStage{0, 3}, me::model::PipelineStage{1, 3},
                       me::model::PipelineStage{2, 3}}) {
      if (c.layers % stage.count) c.layers = 3;
      Transformer m(c, me::parallel::TensorParallel{}, stage);
      std::set<const void*> announced;
      m->set_before_use([&](torch::nn::Module& part) {
        for (const auto& p : part.parameters()) announced.insert(p.unsafeGetTensorImpl());
      });
      auto input = stage.first() ? torch::randint(0, 97, {2, 24}, torch::kLong) : torch::randn({2, 24, c.hidden});
      m->forward_stage(input);
      for (const auto& p : m->named_parameters()) {
        INFO("stage " << stage.index << " of " << stage.count << ", parameter " << p.key());
        CHECK(announced.count(p.value().unsafeGetTensorImpl()) == 1);
      }
    }
}

TEST_CASE("balanced pipeline split: the benchmark's hand-tuned splits; never busier than an even split", "[model]") {
  auto gpt = TransformerConfig::gpt();
  gpt.vocab = 50257, gpt.seq = 2048, gpt.layers = 24, gpt.hidden = 2048, gpt.heads = 16;
  auto llama = TransformerConfig::llama();
  llama.vocab = 32000, llama.seq = 2048, llama.layers = 22, llama.hidden = 2048, llama.heads = 32;
  llama.query_groups = 4, llama.ffn_hidden = 5632;
  // bench/RESULTS.md measured these by hand (the first stage one layer longer: +4.4% for GPT).
  CHECK(me::model::balanced_stage_split(gpt, 2) == std::pair<int64_t, int64_t>{13, 11});
  CHECK(me::model::balanced_stage_split(llama, 2) == std::pair<int64_t, int64_t>{12, 10});
  // Every split is one stage_layers accepts, and its busiest stage has no more work than the
  // even split's (in layers, the output layer counted). LLaMA-2 70B's output layer is 0.28 of a
  // layer: its even split stays; GPT 1.3B's is 1.76 layers: at 4 stages 7/6/6/5.
  auto big = TransformerConfig::llama();
  big.vocab = 32000, big.seq = 4096, big.layers = 80, big.hidden = 8192, big.heads = 64, big.query_groups = 8;
  big.ffn_hidden = 28672;
  CHECK(me::model::balanced_stage_split(gpt, 4) == std::pair<int64_t, int64_t>{7, 5});
  for (const auto& [c, tp, stages] : {std::tuple{gpt, 1, 4}, std::tuple{gpt, 2, 3}, std::tuple{llama, 1, 4},
                                      std::tuple{big, 8, 2}, std::tuple{big, 8, 4}, std::tuple{big, 8, 8},
                                      std::tuple{big, 8, 10}}) {
    INFO(c.layers << " layers, " << stages << " stages");
    const double output = c.output_flops_per_token(tp) / c.layer_flops_per_token();
    const auto [first, last] = me::model::balanced_stage_split(c, stages, tp);
    const auto sizes = me::model::PipelineStage{0, stages, first, last}.stage_layers(c.layers);
    double busiest = 0;
    for (size_t i = 0; i < sizes.size(); ++i)
      busiest = std::max(busiest, static_cast<double>(sizes[i]) + (i + 1 == sizes.size() ? output : 0.0));
    CHECK(busiest <= std::ceil(static_cast<double>(c.layers) / stages) + output);
    if (c.layers == 80) CHECK(sizes == std::vector<int64_t>(static_cast<size_t>(stages), 80 / stages));
  }
  auto tiny = tiny_gpt();
  CHECK(me::model::balanced_stage_split(tiny, 4) == std::pair<int64_t, int64_t>{0, 0});  // 3 layers, 4 stages
}

TEST_CASE("attention is causal: a later token does not change earlier logits", "[model]") {
  for (auto c : {tiny_gpt(), tiny_llama()}) {
    Transformer m(c);
    m->reset_parameters(5);
    auto a = torch::randint(0, 97, {1, 10}, torch::kLong);
    auto b = a.clone();
    b[0][9] = (a[0][9].item<int64_t>() + 1) % 97;
    auto la = m->forward(a), lb = m->forward(b);
    CHECK(torch::allclose(la.narrow(1, 0, 9), lb.narrow(1, 0, 9), 1e-5, 1e-6));
    CHECK_FALSE(torch::allclose(la.narrow(1, 9, 1), lb.narrow(1, 9, 1)));
  }
}

TEST_CASE("init depends on the seed alone; norms start at one, biases at zero", "[model]") {
  Transformer a(tiny_gpt()), b(tiny_gpt()), c(tiny_gpt());
  a->reset_parameters(11);
  b->reset_parameters(11);
  c->reset_parameters(12);
  auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  bool all_equal = true, any_differs = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    all_equal = all_equal && torch::equal(pa[i], pb[i]);
    any_differs = any_differs || !torch::equal(pa[i], pc[i]);
  }
  CHECK(all_equal);
  CHECK(any_differs);
  for (const auto& p : a->named_parameters()) {
    if (p.key().find("norm") != std::string::npos && p.key().find("weight") != std::string::npos)
      CHECK(p.value().eq(1).all().item<bool>());
    if (p.key().find("bias") != std::string::npos) CHECK(p.value().eq(0).all().item<bool>());
  }
}

TEST_CASE("init draws large weights in parallel chunks: the same values whatever the thread count", "[model]") {
  auto cfg = tiny_gpt();
  cfg.vocab = 50257;  // the embedding: 50257 x 32 = 1.6M values, two chunks of 2^20
  cfg.vocab_divisible_by = 1;
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  Transformer serial(cfg, me::parallel::TensorParallel{}, me::model::PipelineStage{}, /*initialize=*/false);
  serial->reset_parameters(11);
  at::set_num_threads(2);
  Transformer parallel(cfg, me::parallel::TensorParallel{}, me::model::PipelineStage{}, /*initialize=*/false),
      initialized(cfg);
  parallel->reset_parameters(11);
  initialized->reset_parameters(11);  // initialized once with seed 0 first: the same result
  at::set_num_threads(threads);
  auto ps = serial->parameters(), pp = parallel->parameters(), pi = initialized->parameters();
  for (size_t i = 0; i < ps.size(); ++i) {
    CHECK(torch::equal(ps[i], pp[i]));
    CHECK(torch::equal(ps[i], pi[i]));
  }
  // The chunks are independent draws of N(0, init_std), not copies of one another.
  const auto emb = serial->named_parameters()["embedding.weight"].reshape({-1});
  const int64_t chunk = int64_t{1} << 20;
  CHECK_FALSE(torch::allclose(emb.narrow(0, 0, 1000), emb.narrow(0, chunk, 1000)));
  CHECK(emb.std().item<double>() == Approx(cfg.init_std).epsilon(0.01));
  CHECK(std::abs(emb.mean().item<double>()) < 1e-4);
}

TEST_CASE("config validation names the field", "[model]") {
  auto c = tiny_gpt();
  c.hidden = 0;
  CHECK_THROWS_WITH(c.validate(), "model.hidden must be a positive integer, got 0");
  c = tiny_gpt();
  c.heads = 5;
  CHECK_THROWS_WITH(c.validate(), "model.hidden (32) must be divisible by model.heads (5)");
  c = tiny_llama();
  CHECK_THROWS_WITH(c.validate("model", 4), Catch::Contains("model.query_groups (2) is not divisible by tp (4)"));
  c.query_groups = 3;
  CHECK_THROWS_WITH(c.validate(), Catch::Contains("model.heads (4) must be divisible by model.query_groups (3)"));
  c = tiny_gpt();
  c.seq = 10;
  CHECK_THROWS_WITH(c.validate("model", 4, true), Catch::Contains("model.seq (10) is not divisible by tp (4)"));
}

TEST_CASE("RoPE rotates each pair by position x base^(-2i/d)", "[model]") {
  const int64_t d = 6, s = 5;
  me::parallel::Rotary rope(d, 16, 10000.0);
  auto x = torch::randn({1, 1, s, d});
  auto y = rope.apply(x);
  for (int64_t p = 0; p < s; ++p) {
    for (int64_t i = 0; i < d / 2; ++i) {
      const double theta = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(i) / d);
      const double x1 = x[0][0][p][i].item<double>(), x2 = x[0][0][p][i + d / 2].item<double>();
      CHECK(y[0][0][p][i].item<double>() == Approx(x1 * std::cos(theta) - x2 * std::sin(theta)).margin(1e-5));
      CHECK(y[0][0][p][i + d / 2].item<double>() == Approx(x2 * std::cos(theta) + x1 * std::sin(theta)).margin(1e-5));
    }
  }
}

TEST_CASE("vocab-parallel cross entropy (tp = 1) equals LibTorch's, ignored positions included", "[model]") {
  auto logits = torch::randn({2, 5, 11}, torch::requires_grad());
  auto labels = torch::randint(0, 11, {2, 5}, torch::kLong);
  labels[0][1] = -100;
  labels[1][4] = -100;
  auto ours = me::parallel::vocab_parallel_cross_entropy(logits, labels, {});
  auto ref_logits = logits.detach().clone().requires_grad_(true);
  auto ref = torch::nn::functional::cross_entropy(ref_logits.reshape({-1, 11}), labels.reshape({-1}));
  CHECK(ours.item<double>() == Approx(ref.item<double>()).epsilon(1e-6));
  ours.backward();
  ref.backward();
  CHECK(torch::allclose(logits.grad(), ref_logits.grad(), 1e-5, 1e-7));
  CHECK(logits.grad()[0][1].abs().sum().item<double>() == 0.0);  // an ignored position gets no gradient
}

TEST_CASE("recomputation (selective, full, every 2nd layer) gives identical gradients", "[model]") {
  auto grads = [](TransformerConfig c) {
    Transformer m(c);
    m->reset_parameters(9);
    torch::manual_seed(4);
    auto tokens = torch::randint(0, 97, {2, 24}, torch::kLong);
    auto labels = torch::randint(0, 97, {2, 24}, torch::kLong);
    m->loss(tokens, labels).backward();
    std::vector<torch::Tensor> g;
    for (auto& p : m->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  for (auto base : {tiny_gpt(), tiny_llama()}) {
    const auto reference = grads(base);
    for (auto [mode, every] : {std::pair<const char*, int64_t>{"selective", 1}, {"full", 1}, {"full", 2}}) {
      auto c = base;
      c.recompute = mode;
      c.recompute_every = every;
      const auto g = grads(c);
      REQUIRE(g.size() == reference.size());
      for (size_t i = 0; i < g.size(); ++i) {
        INFO(c.describe() << " recompute " << mode << " every " << every << ", parameter " << i);
        CHECK(torch::equal(g[i], reference[i]));
      }
    }
  }
}

TEST_CASE("generate extends the prompt and is deterministic for a seed", "[model]") {
  Transformer m(tiny_llama());
  auto a = me::model::generate(m, {1, 2, 3}, 10, 5, 1.0, 42);
  auto b = me::model::generate(m, {1, 2, 3}, 10, 5, 1.0, 42);
  REQUIRE(a.size() == 13);
  CHECK(a == b);
  for (auto t : a) CHECK((t >= 0 && t < 97));
}

TEST_CASE("RMSNorm on the GPU (LibTorch's fused kernel where it has one) matches the fp32 composition", "[model][gpu]") {
  if (!torch::cuda::is_available()) {
    WARN("no CUDA GPU: checked on the GPU machine");
    return;
  }
  torch::manual_seed(5);
  const auto dev = torch::Device(torch::kCUDA, 0);
  auto x = torch::randn({4, 64, 1024}, torch::TensorOptions().device(dev)).to(torch::kBFloat16).requires_grad_(true);
  auto w = (1 + 0.1 * torch::randn({1024}, torch::TensorOptions().device(dev))).to(torch::kBFloat16).requires_grad_(true);
  auto gy = torch::randn({4, 64, 1024}, torch::TensorOptions().device(dev)).to(torch::kBFloat16);
  auto y = me::compat::rms_norm(x, w, 1e-5);
  y.backward(gy);
  // The reference in fp32 from the same bf16 inputs.
  auto xr = x.detach().to(torch::kFloat).requires_grad_(true), wr = w.detach().to(torch::kFloat).requires_grad_(true);
  auto yr = xr * torch::rsqrt(xr.pow(2).mean(-1, true) + 1e-5) * wr;
  yr.backward(gy.to(torch::kFloat));
  auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
    return ((a.to(torch::kFloat) - b).norm() / b.norm()).item<double>();
  };
  CHECK(y.scalar_type() == torch::kBFloat16);
  CHECK(rel(y, yr) < 1e-2);  // bf16 outputs: ~3 significant digits
  CHECK(rel(x.grad(), xr.grad()) < 2e-2);
  CHECK(rel(w.grad(), wr.grad()) < 2e-2);
}

namespace {

// Gradient-accumulation fusion against autograd's own gradients copied in by the buffer's
// hooks, over two micro-batches (the first overwrites the main grads, the second adds). The
// fused model also recomputes its blocks (the fused backward then runs inside the recomputed one).
void check_grad_accumulation_fusion(const torch::Device& device, torch::ScalarType dtype, double tolerance,
                                    TransformerConfig c = tiny_gpt()) {
  ModelWithGrads plain_run(c, 3, device, dtype, /*fused=*/false);
  c.recompute = "full";
  ModelWithGrads fused_run(c, 3, device, dtype, /*fused=*/true);
  auto &plain = plain_run.model, &fused = fused_run.model;
  auto &plain_grads = *plain_run.grads, &fused_grads = *fused_run.grads;
  torch::manual_seed(4);
  auto tokens = torch::randint(0, c.vocab, {2, 2, c.seq}, torch::kLong).to(device);
  for (auto* run : {&fused_run, &plain_run}) {
    run->grads->begin_step(2);
    for (int micro = 0; micro < 2; ++micro) run->model->loss(tokens[micro], tokens[micro].roll(-1, 1)).backward();
    run->grads->finish();
  }
  // Every parameter got a gradient, the same either way.
  for (size_t i = 0; i < plain->parameters().size(); ++i) {
    INFO("parameter " << plain->named_parameters()[i].key());
    const auto f = fused_grads.view(i).to(torch::kCPU, torch::kFloat), p = plain_grads.view(i).to(torch::kCPU, torch::kFloat);
    CHECK(p.abs().sum().item<double>() > 0);
    CHECK(((f - p).norm() / p.norm()).item<double>() < tolerance);
  }
  // The linear weights' and the word embedding's gradients (tied: the output layer's GEMM and
  // the lookup's backward both add into it) never went through autograd.
  for (const auto& item : fused->named_parameters())
    if (item.key().find("fc1.weight") != std::string::npos || item.key().find("up.weight") != std::string::npos ||
        item.key() == "embedding.weight" || item.key() == "output.weight") {
      INFO(item.key());
      CHECK_FALSE(item.value().grad().defined());
    }
}
}  // namespace

TEST_CASE("gradient-accumulation fusion: main grads written by the linear layers = autograd's", "[model]") {
  check_grad_accumulation_fusion(torch::kCPU, torch::kFloat, 1e-5);
  check_grad_accumulation_fusion(torch::kCPU, torch::kFloat, 1e-5, tiny_llama());  // untied output layer
}

TEST_CASE("gradient-accumulation fusion on the GPU (fp32-output GEMMs)", "[model][gpu]") {
  if (!torch::cuda::is_available()) {
    WARN("no CUDA GPU: checked on the GPU machine");
    return;
  }
  const torch::Device gpu(torch::kCUDA, 0);
  check_grad_accumulation_fusion(gpu, torch::kFloat, 1e-5);
  // bf16: the fused gradients skip a bf16 rounding the hooks' copies have.
  check_grad_accumulation_fusion(gpu, torch::kBFloat16, 3e-2);
}

namespace {
// Weight gradients held back (a pipeline stage's parallel.pp_deferred_wgrads) and run later,
// oldest micro-batch first, leave the same bits in the main grads as running them at once. Fully
// recomputed blocks run theirs at once instead (WeightGradsInline: held, they would keep the
// rebuilt activations alive): their first micro-batch's gradients are in before the queue runs.
void check_held_back_weight_grads(const torch::Device& device, torch::ScalarType dtype, const std::string& recompute) {
  INFO("recompute " << recompute);
  auto c = tiny_gpt();
  c.recompute = recompute;
  ModelWithGrads now_run(c, 5, device, dtype, /*fused=*/true), held_run(c, 5, device, dtype, /*fused=*/true);
  auto &now = now_run.model, &held = held_run.model;
  auto &now_grads = *now_run.grads, &held_grads = *held_run.grads;
  torch::manual_seed(6);
  auto tokens = torch::randint(0, c.vocab, {3, 2, c.seq}, torch::kLong).to(device);
  now_grads.begin_step(3);
  for (int micro = 0; micro < 3; ++micro) now->loss(tokens[micro], tokens[micro].roll(-1, 1)).backward();
  now_grads.finish();

  me::parallel::WeightGradQueue queue;
  held_grads.begin_step(3);
  auto fc1 = held->named_parameters().size();
  for (size_t i = 0; i < held->named_parameters().size(); ++i)
    if (held->named_parameters()[i].key().find("fc1.weight") != std::string::npos) fc1 = i;
  REQUIRE(fc1 < held->named_parameters().size());
  for (int micro = 0; micro < 3; ++micro) {
    queue.begin_micro_batch();
    held_grads.hold_back_into(&queue);
    held->loss(tokens[micro], tokens[micro].roll(-1, 1)).backward();
    held_grads.hold_back_into(nullptr);
    if (micro == 0) CHECK((held_grads.view(fc1).abs().sum().item<double>() != 0) == (recompute == "full"));
    if (micro == 1) queue.run_oldest();  // micro-batch 0's, between the others' backward passes
  }
  CHECK(queue.micro_batches() == 2);
  CHECK(held_grads.view(fc1).abs().sum().item<double>() != 0);  // micro-batch 0's, already in
  queue.run_down_to(0);
  CHECK(queue.micro_batches() == 0);
  held_grads.finish();
  for (size_t i = 0; i < now->parameters().size(); ++i) {
    INFO("parameter " << now->named_parameters()[i].key());
    CHECK(torch::equal(held_grads.view(i), now_grads.view(i)));
  }
}
}  // namespace

TEST_CASE("held-back weight gradients (pp_deferred_wgrads) leave the same main grads", "[model]") {
  check_held_back_weight_grads(torch::kCPU, torch::kFloat, "none");
  check_held_back_weight_grads(torch::kCPU, torch::kFloat, "full");
}

TEST_CASE("held-back weight gradients on the GPU", "[model][gpu]") {
  if (!torch::cuda::is_available()) {
    WARN("no CUDA GPU: checked on the GPU machine");
    return;
  }
  check_held_back_weight_grads(torch::Device(torch::kCUDA, 0), torch::kBFloat16, "none");
  check_held_back_weight_grads(torch::Device(torch::kCUDA, 0), torch::kBFloat16, "full");
}

namespace {
// An autograd function whose backward holds `gemm` for the next collective (DelayedWeightGrad),
// as a linear layer's backward does under parallel.tp_delay_wgrad.
std::vector<std::string>* delayed_log = nullptr;
struct HoldsInBackward : public torch::autograd::Function<HoldsInBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const std::string& name) {
    ctx->saved_data["name"] = name;
    return x * 2;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::variable_list g) {
    const auto name = ctx->saved_data["name"].toStringRef();
    delayed_log->push_back("backward " + name);
    me::parallel::DelayedWeightGrad::hold([name] { delayed_log->push_back("gemm " + name); });
    if (name == "throws") throw std::runtime_error("backward failed after holding");
    return {g[0] * 2, torch::Tensor()};
  }
};
}  // namespace

TEST_CASE("delayed weight gradients: each held one runs beside the next collective, the last when backward ends", "[model]") {
  std::vector<std::string> log;
  delayed_log = &log;
  auto x = torch::ones({2}, torch::requires_grad());
  auto y = HoldsInBackward::apply(HoldsInBackward::apply(x, "first"), "second");  // backward: second, then first
  y.sum().backward();
  // Holding "first" ran "second" (held before it); the end of the pass ran "first".
  CHECK(log == std::vector<std::string>{"backward second", "backward first", "gemm second", "gemm first"});
  CHECK(x.grad().equal(torch::full({2}, 4.0)));

  log.clear();
  auto z = HoldsInBackward::apply(x, "lone");
  z.sum().backward();
  me::parallel::DelayedWeightGrad::run();  // nothing held any more: no second run
  CHECK(log == std::vector<std::string>{"backward lone", "gemm lone"});

  // A pass that failed part-way leaves its GEMM held; the next step drops it (PipelineSchedule::train).
  log.clear();
  auto w = HoldsInBackward::apply(x, "throws");
  CHECK_THROWS(w.sum().backward());
  CHECK(log == std::vector<std::string>{"backward throws"});
  me::parallel::DelayedWeightGrad::drop();
  me::parallel::DelayedWeightGrad::run();
  CHECK(log == std::vector<std::string>{"backward throws"});
  delayed_log = nullptr;
}

TEST_CASE("symmetric slots: one size, given back when the tensor dies, nothing past the limit", "[model]") {
  std::vector<int64_t> allocations;
  auto allocate = [&](int64_t bytes) {
    allocations.push_back(bytes);
    return torch::zeros({bytes}, torch::kByte);
  };
  const int64_t window = 8 * 65536;  // eight 64 KiB slots per registration
  me::parallel::SymmetricSlots slots(allocate, window + window / 2);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat);
  std::vector<torch::Tensor> held;
  for (int i = 0; i < 8; ++i) {
    held.push_back(slots.take({4, 1000}, opts));  // 16,000 B: a 64 KiB slot
    REQUIRE(held.back().defined());
    CHECK(held.back().sizes() == torch::IntArrayRef({4, 1000}));
  }
  CHECK(allocations == std::vector<int64_t>{window});
  // No slot free and a second registration would pass the limit: ordinary memory (nothing).
  CHECK_FALSE(slots.take({4, 1000}, opts).defined());
  CHECK_FALSE(slots.take({4, 100000}, opts).defined());  // larger than a slot
  CHECK(slots.fallbacks() == 2);
  // Slots are distinct, and a dead tensor's slot is the next one taken.
  std::set<const void*> addresses;
  for (const auto& t : held) addresses.insert(t.data_ptr());
  CHECK(addresses.size() == 8);
  const void* third = held[2].data_ptr();
  held[2] = torch::Tensor();
  auto again = slots.take({2, 10}, opts);  // smaller fits too
  CHECK(again.data_ptr() == third);
  CHECK(slots.registered_bytes() == window);
}

TEST_CASE("copy-engine all-gather: the peers' rows as runs of contiguous ranks, in pull order", "[model]") {
  using me::parallel::peer_runs;
  // "first:count:last_pull" per run
  auto flat = [](const std::vector<me::parallel::PeerRun>& runs) {
    std::string out;
    for (const auto& r : runs)
      out += (out.empty() ? "" : " ") + std::to_string(r.first) + ":" + std::to_string(r.count) + ":" +
             std::to_string(r.last_pull);
    return out;
  };
  // one peer a GEMM (the default): every pull, in ring order
  CHECK(flat(peer_runs(1, 4, 1)) == "2:1:1 3:1:2 0:1:3");
  // up to 3: rank 1 pulls 2, 3, then 0 across the wrap
  CHECK(flat(peer_runs(1, 4, 3)) == "2:2:2 0:1:3");
  CHECK(flat(peer_runs(3, 4, 3)) == "0:3:3");
  CHECK(flat(peer_runs(0, 4, 2)) == "1:2:2 3:1:3");
  CHECK(flat(peer_runs(0, 2, 8)) == "1:1:1");
  // every peer exactly once, whatever the group
  for (int size : {2, 4, 8})
    for (int rank = 0; rank < size; ++rank)
      for (int group = 1; group <= size; ++group) {
        std::set<int> seen;
        int pulls = 0;
        for (const auto& r : peer_runs(rank, size, group)) {
          CHECK(r.count >= 1);
          CHECK(r.count <= group);
          CHECK(r.first + r.count <= size);  // contiguous rows
          for (int i = 0; i < r.count; ++i) CHECK(seen.insert(r.first + i).second);
          pulls += r.count;
          CHECK(r.last_pull == pulls);
        }
        CHECK(pulls == size - 1);
        CHECK(seen.count(rank) == 0);
      }
}

TEST_CASE("copy-engine all-gather: a GEMM wide enough to outlast the pulls takes every peer's rows at once", "[model]") {
  using me::parallel::gather_group_for;
  if (std::getenv("ME_TP_GATHER_GROUP")) return;  // the experiment fixes the group
  // tp 4, the output columns per rank: LLaMA-2-70B's gate/up (2 x 28672 / 4) outlasts three pulls
  CHECK(gather_group_for(2 * 28672 / 4, 4) == 3);
  // its QKV ((64 + 2 x 8) x 128 / 4) and GPT-39B's QKV (3 x 8192 / 4) and fc1 (4 x 8192 / 4) do not
  CHECK(gather_group_for((64 + 16) * 128 / 4, 4) == 1);
  CHECK(gather_group_for(3 * 8192 / 4, 4) == 1);
  CHECK(gather_group_for(4 * 8192 / 4, 4) == 1);
  // one peer: nothing to group; an unknown width: each peer as it lands
  CHECK(gather_group_for(2 * 28672 / 2, 2) == 1);
  CHECK(gather_group_for(0, 4) == 1);
  // tp 8, LLaMA-2-70B's gate/up (7168 columns) against seven pulls: per peer
  CHECK(gather_group_for(2 * 28672 / 8, 8) == 1);
}
