#include <catch2/catch.hpp>

#include <cmath>
#include <functional>

#include "engine/optim/adamw.h"
#include "engine/optim/lr_schedule.h"
#include "engine/optim/master_optimizer.h"

using me::optim::LRSchedule;

namespace {
// The hand-computed AdamW trajectory shared by both optimizer tests. w is a matrix (decayed),
// b a bias (not decayed). With a constant gradient, bias-corrected Adam moves each weight by
// lr * sign(g) per step (up to eps); decay shrinks w first:
//   step 1: w = [1, -2] * (1 - 0.1*0.1) = [0.99, -1.98], then -= 0.1*sign(g) -> [0.89, -1.88]
//   step 2: w = [0.89, -1.88] * 0.99 = [0.8811, -1.8612], then -> [0.7811, -1.7612]
//   bias:   1 -> 0.9 -> 0.8 (no decay)
void check_two_adamw_steps(const torch::Tensor& w, const torch::Tensor& b, const std::function<void()>& step) {
  step();
  CHECK(w[0][0].item<double>() == Approx(0.89).margin(1e-6));
  CHECK(w[1][0].item<double>() == Approx(-1.88).margin(1e-6));
  CHECK(b[0].item<double>() == Approx(0.9).margin(1e-6));
  step();
  CHECK(w[0][0].item<double>() == Approx(0.7811).margin(1e-6));
  CHECK(w[1][0].item<double>() == Approx(-1.7612).margin(1e-6));
  CHECK(b[0].item<double>() == Approx(0.8).margin(1e-6));
}
}  // namespace

TEST_CASE("AdamW: two steps against hand-computed values", "[optim]") {
  auto w = torch::tensor({1.0f, -2.0f}).reshape({2, 1}).requires_grad_(true);
  auto b = torch::tensor({1.0f}).requires_grad_(true);
  me::optim::OptimizerOptions cfg;
  cfg.betas = {0.9, 0.999};
  auto groups = me::optim::decay_groups({w, b}, cfg.weight_decay);
  REQUIRE(groups[0].params.size() == 1);  // w decays
  REQUIRE(groups[1].params.size() == 1);  // b does not
  me::optim::AdamW opt(groups, cfg);
  w.mutable_grad() = torch::tensor({0.5f, -0.1f}).reshape({2, 1});
  b.mutable_grad() = torch::tensor({0.5f});
  check_two_adamw_steps(w, b, [&] { opt.step(0.1); });
  CHECK(opt.steps() == 2);
}

TEST_CASE("AdamW: a varying gradient, checked against the update formula", "[optim]") {
  // g1 = 1, g2 = -3 on a scalar weight of 2 (no decay): m2 = 0.9*0.1 + 0.1*(-3) = -0.21,
  // v2 = 0.999*0.001 + 0.001*9 = 0.009999, m^ = -0.21/0.19, v^ = 0.009999/0.001999,
  // w2 = w1 - lr * m^ / (sqrt(v^) + eps), w1 = 2 - lr.
  auto w = torch::tensor({2.0}, torch::kDouble).requires_grad_(true);
  me::optim::OptimizerOptions options;
  options.betas = {0.9, 0.999};
  options.weight_decay = 0.0;
  me::optim::AdamW opt({{{w}, 0.0}}, options);
  w.mutable_grad() = torch::tensor({1.0}, torch::kDouble);
  opt.step(0.01);
  w.mutable_grad() = torch::tensor({-3.0}, torch::kDouble);
  opt.step(0.01);
  const double mhat = -0.21 / 0.19, vhat = 0.009999 / (1 - 0.999 * 0.999);
  const double expected = (2.0 - 0.01) - 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
  CHECK(w.item<double>() == Approx(expected).epsilon(1e-9));
}

namespace {
// A MasterOptimizer over fp32 parameters whose gradients sit in one flat buffer, as the trainer
// builds it (no TP/DP groups).
struct Flat {
  std::vector<me::optim::MasterParam> params;
  torch::Tensor grads;
  me::parallel::FlatLayout layout;
  // grad_dtype: the gradient buffer's (bf16 under parallel.grad_reduce_dtype = "bf16")
  Flat(std::vector<me::optim::MasterParam> p, std::vector<float> g, torch::ScalarType grad_dtype = torch::kFloat)
      : params(std::move(p)) {
    grads = torch::tensor(g).to(grad_dtype);
    std::vector<int64_t> numels;
    for (auto& mp : params) numels.push_back(mp.param.numel());
    layout = me::parallel::FlatLayout::packed(numels);
  }
  me::optim::MasterOptimizer make(me::optim::OptimizerConfig cfg) {
    return me::optim::MasterOptimizer(params, grads, layout, cfg, nullptr, nullptr);
  }
};

// SGD at lr 1 without momentum or decay, clipped to a global norm of 1: the update is exactly
// minus the clipped gradient.
me::optim::OptimizerConfig sgd_clipped_to_1() {
  me::optim::OptimizerConfig sgd;
  sgd.options.kind = "sgd";
  sgd.options.momentum = 0;
  sgd.options.weight_decay = 0;
  sgd.options.clip = 1.0;
  return sgd;
}
}  // namespace

TEST_CASE("the trainer's optimizer: AdamW two steps against hand-computed values", "[optim]") {
  // The numbers of the first AdamW test, through MasterOptimizer (what training runs): the
  // matrix decays, the bias does not; clipping is off.
  auto w = torch::tensor({1.0f, -2.0f}).reshape({2, 1});
  auto b = torch::tensor({1.0f});
  Flat f({{w, true, true}, {b, false, true}}, {0.5f, -0.1f, 0.5f});
  me::optim::OptimizerConfig cfg;
  cfg.options.betas = {0.9, 0.999};
  cfg.options.clip = 0;
  auto opt = f.make(cfg);
  check_two_adamw_steps(w, b, [&] { opt.step(0.1); });
}

TEST_CASE("the trainer's optimizer: bf16 gradients (parallel.grad_reduce_dtype) step as their fp32 values", "[optim]") {
  // AdamW: the hand-computed trajectory again, from a bf16 gradient buffer.
  auto w = torch::tensor({1.0f, -2.0f}).reshape({2, 1});
  auto b = torch::tensor({1.0f});
  Flat f({{w, true, true}, {b, false, true}}, {0.5f, -0.1f, 0.5f}, torch::kBFloat16);
  me::optim::OptimizerConfig cfg;
  cfg.options.betas = {0.9, 0.999};
  cfg.options.clip = 0;
  auto opt = f.make(cfg);
  check_two_adamw_steps(w, b, [&] { opt.step(0.1); });
  // SGD with clipping: gradients (3, 0) and (4) are exact in bf16, so the norm is 5 exactly and
  // the update minus the clipped gradient.
  auto a = torch::zeros({2});
  auto c = torch::zeros({1});
  Flat g({{a, false, true}, {c, false, true}}, {3.0f, 0.0f, 4.0f}, torch::kBFloat16);
  auto sgd_opt = g.make(sgd_clipped_to_1());
  CHECK(sgd_opt.step(1.0) == 5.0);
  CHECK(a[0].item<double>() == Approx(-0.6).epsilon(1e-2));  // the clipped gradient, rounded to bf16
  CHECK(c[0].item<double>() == Approx(-0.8).epsilon(1e-2));
}

TEST_CASE("the trainer's optimizer: global-norm clipping, replicated parameters counted once", "[optim]") {
  // grads (3, 0) and (4): norm 5, clipped to 1 -> scaled by 1/5.
  auto a = torch::zeros({2});
  auto c = torch::zeros({1});
  const auto sgd = sgd_clipped_to_1();
  {
    Flat f({{a, false, true}, {c, false, true}}, {3.0f, 0.0f, 4.0f});
    auto opt = f.make(sgd);
    CHECK(opt.step(1.0) == Approx(5.0));
    CHECK(a[0].item<double>() == Approx(-0.6).epsilon(1e-5));
    CHECK(c[0].item<double>() == Approx(-0.8).epsilon(1e-5));
  }
  // A parameter replicated over TP and held by a TP rank > 0 does not count in the norm (its
  // gradient is the same on every TP rank), but is still clipped and updated.
  a.zero_();
  c.zero_();
  {
    Flat f({{a, false, true}, {c, false, false}}, {3.0f, 0.0f, 4.0f});
    auto opt = f.make(sgd);
    CHECK(opt.step(1.0) == Approx(3.0));
    CHECK(a[0].item<double>() == Approx(-1.0).epsilon(1e-5));
    CHECK(c[0].item<double>() == Approx(-4.0 / 3.0).epsilon(1e-5));
  }
  // Below the threshold nothing is scaled; a non-finite norm skips the update entirely.
  a.zero_();
  {
    Flat f({{a, false, true}}, {0.3f, 0.4f});
    auto opt = f.make(sgd);
    CHECK(opt.step(1.0) == Approx(0.5));
    CHECK(a[1].item<double>() == Approx(-0.4).epsilon(1e-5));
  }
  a.zero_();
  {
    Flat f({{a, false, true}}, {std::nanf(""), 1.0f});
    auto opt = f.make(sgd);
    CHECK(std::isnan(opt.step(1.0)));
    CHECK(a.abs().sum().item<double>() == 0.0);
  }
}

TEST_CASE("the trainer's optimizer: the fused GPU AdamW (clipping folded in) matches the CPU path", "[optim][gpu]") {
  if (!torch::cuda::is_available()) {
    WARN("no CUDA GPU: the fused AdamW kernel is checked on the GPU machine");
    return;
  }
  // Random bf16 weights with fp32 masters, clipped every step (norm above 0.5), five steps, one
  // matrix that decays and one vector that does not: the GPU's fused kernel against the CPU's
  // multi-tensor composition, step by step.
  torch::manual_seed(3);
  auto w0 = torch::randn({64, 33}), b0 = torch::randn({33});
  auto g0 = torch::randn({64 * 33 + 33});
  me::optim::OptimizerConfig cfg;
  cfg.options.betas = {0.9, 0.95};
  cfg.options.clip = 0.5;
  auto run = [&](torch::Device dev, torch::ScalarType grad_dtype) {
    auto w = w0.to(dev, torch::kBFloat16), b = b0.to(dev, torch::kBFloat16);
    std::vector<me::optim::MasterParam> params = {{w, true, true}, {b, false, true}};
    auto grads = g0.to(dev, grad_dtype, /*non_blocking=*/false, /*copy=*/true);  // never g0: clipping scales it
    me::optim::MasterOptimizer opt(params, grads, me::parallel::FlatLayout::packed({64 * 33, 33}), cfg, nullptr, nullptr);
    std::vector<double> norms;
    for (int k = 0; k < 5; ++k) {
      grads.copy_(g0.to(dev) * (1.0 + 0.1 * k));
      norms.push_back(opt.step(1e-2));
    }
    return std::make_tuple(w.to(torch::kCPU, torch::kFloat), b.to(torch::kCPU, torch::kFloat), norms);
  };
  // fp32 gradients, and bf16 ones (parallel.grad_reduce_dtype = "bf16": the kernel reads them as they are)
  for (const auto grad_dtype : {torch::kFloat, torch::kBFloat16}) {
    INFO("gradients " << grad_dtype);
    const auto [wc, bc, nc] = run(torch::kCPU, grad_dtype);
    const auto [wg, bg, ng] = run(torch::Device(torch::kCUDA, 0), grad_dtype);
    for (size_t k = 0; k < nc.size(); ++k) CHECK(ng[k] == Approx(nc[k]).epsilon(1e-6));
    // bf16 weights: the two paths may round the last update to neighbouring bf16 values.
    CHECK(torch::allclose(wg, wc, 1e-2, 1e-2));
    CHECK(torch::allclose(bg, bc, 1e-2, 1e-2));
    CHECK((wg - w0).abs().max().item<double>() > 1e-2);  // the weights did move
  }
}

TEST_CASE("LR schedules at named points", "[optim]") {
  struct Row {
    LRSchedule::Kind kind;
    int64_t step;
    double expected;
  };
  // max 1.0, min 0.1, warmup 10, decay ends at 110 (wsd: final anneal of 20 from 90).
  const double cos35 = 0.1 + 0.9 * 0.5 * (std::cos(M_PI * 0.25) + 1.0);
  const Row rows[] = {
      {LRSchedule::Kind::cosine, 0, 0.0},     {LRSchedule::Kind::cosine, 5, 0.5},
      {LRSchedule::Kind::cosine, 10, 1.0},    {LRSchedule::Kind::cosine, 35, cos35},
      {LRSchedule::Kind::cosine, 60, 0.55},   {LRSchedule::Kind::cosine, 110, 0.1},
      {LRSchedule::Kind::cosine, 500, 0.1},   {LRSchedule::Kind::linear, 5, 0.5},
      {LRSchedule::Kind::linear, 35, 0.775},  {LRSchedule::Kind::linear, 60, 0.55},
      {LRSchedule::Kind::linear, 110, 0.1},   {LRSchedule::Kind::constant, 5, 0.5},
      {LRSchedule::Kind::constant, 500, 1.0}, {LRSchedule::Kind::inverse_sqrt, 5, 0.5},
      {LRSchedule::Kind::inverse_sqrt, 40, 0.5}, {LRSchedule::Kind::inverse_sqrt, 4000, 0.1},
      {LRSchedule::Kind::wsd, 50, 1.0},       {LRSchedule::Kind::wsd, 90, 1.0},
      {LRSchedule::Kind::wsd, 100, 0.55},     {LRSchedule::Kind::wsd, 110, 0.1},
  };
  for (const auto& r : rows) {
    LRSchedule s;
    s.kind = r.kind;
    s.max_lr = 1.0;
    s.min_lr = 0.1;
    s.warmup = 10;
    s.decay = 110;
    s.wsd_decay = 20;
    s.validate();
    INFO(LRSchedule::kind_name(r.kind) << " at step " << r.step);
    CHECK(s.lr(r.step) == Approx(r.expected).margin(1e-12));
  }
}

TEST_CASE("LR schedule validation", "[optim]") {
  LRSchedule s;
  s.max_lr = 1e-3;
  s.warmup = 50;
  s.decay = 40;
  CHECK_THROWS_WITH(s.validate(), Catch::Contains("decay length (40) must exceed the warmup (50)"));
  CHECK_THROWS_WITH(LRSchedule::parse_kind("cosin"), Catch::Contains("unknown schedule 'cosin'"));
  CHECK(LRSchedule::parse_kind("inverse-square-root") == LRSchedule::Kind::inverse_sqrt);
}

TEST_CASE("LR schedule counted in samples, with the seed recipe's numbers", "[optim]") {
  // 39B recipe: lr 6e-5 cosine, min 6e-6 (Megatron's default 10%), warmup 183,105 samples,
  // decay over 126,953,125 samples; train 146,484,375 samples at global batch 288.
  LRSchedule s;
  s.kind = LRSchedule::Kind::cosine;
  s.max_lr = 6e-5;
  s.min_lr = 6e-6;
  s.warmup = 183105;
  s.decay = 126953125;
  s.validate();
  CHECK(s.lr(288) == Approx(6e-5 * 288.0 / 183105.0).epsilon(1e-12));
  CHECK(s.lr(183105) == Approx(6e-5));
  const int64_t mid = 183105 + (126953125 - 183105) / 2;
  CHECK(s.lr(mid) == Approx(6e-6 + 0.5 * (6e-5 - 6e-6) * (std::cos(M_PI * 0.5) + 1.0)).epsilon(1e-9));
  CHECK(s.lr(126953125) == Approx(6e-6));
  CHECK(s.lr(146484375) == Approx(6e-6));  // past the decay: min lr to the end
  const int64_t iterations = (146484375 + 287) / 288;
  CHECK(iterations == 508627);  // 508,626.3 rounded up: the last iteration is partial in samples
}

#include "engine/optim/loss_scaler.h"

TEST_CASE("dynamic loss scaling: backoff after hysteresis, growth after clean steps", "[optim]") {
  me::optim::LossScaler s(1024.0, 1.0, /*growth_interval=*/3, /*hysteresis=*/2);
  CHECK(s.scale() == 1024.0);
  s.update(true);  // first overflow: hysteresis absorbs it
  CHECK(s.scale() == 1024.0);
  s.update(true);  // second: halve
  CHECK(s.scale() == 512.0);
  s.update(true);  // hysteresis stays spent until a growth resets it
  CHECK(s.scale() == 256.0);
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 256.0);
  s.update(false);  // third clean step in a row: double, hysteresis restored
  CHECK(s.scale() == 512.0);
  s.update(true);
  CHECK(s.scale() == 512.0);
  s.update(false);  // an overflow resets the clean-step count
  s.update(false);
  CHECK(s.scale() == 512.0);
  me::optim::LossScaler floor(2.0, 1.0, 1000, 1);
  for (int i = 0; i < 5; ++i) floor.update(true);
  CHECK(floor.scale() == 1.0);  // never below the minimum
}
