// engine/kernels against the LibTorch compositions they replace. The GPU cases run on the GPU
// machine (a warning and nothing else here); the CPU cases check that CPU tensors never reach
// a kernel, so the compositions (the fallback) are what the rest of the CPU suite exercises.
#include <catch2/catch.hpp>

#include "engine/core/determinism.h"
#include "engine/core/torch_compat.h"
#include "engine/kernels/candidate_choice.h"
#include "engine/kernels/fused_ops.h"
#include "engine/model/transformer.h"
#include "engine/optim/adamw.h"
#include "engine/parallel/layers.h"

namespace kernels = me::kernels;

namespace {

bool have_gpu() {
  if (torch::cuda::is_available()) return true;
  WARN("no CUDA GPU: checked on the GPU machine");
  return false;
}

const torch::Device kGpu(torch::kCUDA, 0);

// |a - b| / |b| over the whole tensor, in fp32.
double rel(const torch::Tensor& a, const torch::Tensor& b) {
  auto bf = b.to(torch::kCPU, torch::kFloat);
  return ((a.to(torch::kCPU, torch::kFloat) - bf).norm() / bf.norm().clamp_min(1e-30)).item<double>();
}

// Tolerance of a result stored in `dtype`: bf16 keeps ~3 significant digits.
double tol(torch::ScalarType dtype) { return dtype == torch::kBFloat16 ? 1e-2 : 1e-5; }

// A small model of the family `c` (vocab 128, seq 32, 2 layers, hidden 64) with `heads` heads.
me::model::TransformerConfig tiny(me::model::TransformerConfig c, int64_t heads) {
  c.vocab = 128;
  c.vocab_divisible_by = 1;
  c.seq = 32;
  c.layers = 2;
  c.hidden = 64;
  c.heads = heads;
  return c;
}

me::model::TransformerConfig tiny_llama() {
  auto c = tiny(me::model::TransformerConfig::llama(), 8);
  c.query_groups = 2;
  c.ffn_multiple_of = 16;
  return c;
}

}  // namespace

TEST_CASE("fused kernels never take CPU tensors: the LibTorch compositions run there", "[kernels]") {
  for (auto op : {kernels::Op::swiglu, kernels::Op::rotary, kernels::Op::cross_entropy, kernels::Op::adamw,
                  kernels::Op::add_norm, kernels::Op::gemm_gelu, kernels::Op::chunk_gemm, kernels::Op::wgrad_gemm})
    CHECK_FALSE(kernels::use(op, torch::ones({4})));
  CHECK_FALSE(kernels::use(kernels::Op::swiglu, torch::Tensor()));
  CHECK_FALSE(kernels::describe().empty());
}

TEST_CASE("SwiGLU kernel = silu(gate) * up, forward and backward", "[kernels][gpu]") {
  if (!have_gpu()) return;
  for (auto dtype : {torch::kBFloat16, torch::kFloat}) {
    INFO("dtype " << dtype);
    torch::manual_seed(1);
    auto h = (2 * torch::randn({3, 50, 2 * 88}, kGpu)).to(dtype).requires_grad_(true);
    auto dy = torch::randn({3, 50, 88}, kGpu).to(dtype);
    auto y = kernels::swiglu(h);
    y.backward(dy);
    // The composition, in fp32 from the same inputs.
    auto hr = h.detach().to(torch::kFloat).requires_grad_(true);
    auto pairs = hr.view({3, 50, 88, 2});
    auto yr = torch::silu(pairs.select(3, 0)) * pairs.select(3, 1);
    yr.backward(dy.to(torch::kFloat));
    CHECK(y.scalar_type() == dtype);
    CHECK(rel(y, yr) < tol(dtype));
    CHECK(rel(h.grad(), hr.grad()) < tol(dtype));
  }
  // An odd element count takes the scalar path.
  auto h = torch::randn({1, 7, 6}, kGpu).requires_grad_(true);
  auto p = h.view({1, 7, 3, 2});
  CHECK(rel(kernels::swiglu(h), torch::silu(p.select(3, 0)) * p.select(3, 1)) < 1e-5);
}

TEST_CASE("QKV split (+ RoPE) kernel = narrow/select (+ Rotary::apply), forward and backward", "[kernels][gpu]") {
  if (!have_gpu()) return;
  const int64_t b = 2, s = 40, d = 16;
  me::parallel::Rotary rope(d, 64, 10000.0);
  for (auto dtype : {torch::kBFloat16, torch::kFloat}) {
    for (int64_t rep : {1, 4}) {
     for (bool with_rope : {true, false}) {
      const int64_t groups = 3, heads = groups * rep;
      INFO("dtype " << dtype << ", rep " << rep << (with_rope ? ", RoPE" : ", no RoPE"));
      torch::manual_seed(2);
      auto qkv = torch::randn({b, s, groups * (rep + 2) * d}, kGpu).to(dtype).requires_grad_(true);
      auto out = with_rope ? kernels::split_qkv(qkv, groups, rep, d, rope.cos_half(kGpu), rope.sin_half(kGpu))
                           : kernels::split_qkv(qkv, groups, rep, d);
      auto gq = torch::randn({b, heads, s, d}, kGpu).to(dtype), gk = torch::randn({b, groups, s, d}, kGpu).to(dtype),
           gv = torch::randn({b, groups, s, d}, kGpu).to(dtype);
      torch::autograd::backward({out.q, out.k, out.v}, {gq, gk, gv});
      // The composition the attention layer runs without the kernel, in fp32.
      auto xr = qkv.detach().to(torch::kFloat).requires_grad_(true);
      auto x5 = xr.view({b, s, groups, rep + 2, d});
      auto q = x5.narrow(3, 0, rep).reshape({b, s, heads, d}).transpose(1, 2);
      auto k = x5.select(3, rep).transpose(1, 2);
      if (with_rope) q = rope.apply(q), k = rope.apply(k);
      auto v = x5.select(3, rep + 1).transpose(1, 2);
      torch::autograd::backward({q, k, v}, {gq.to(torch::kFloat), gk.to(torch::kFloat), gv.to(torch::kFloat)});
      CHECK(out.q.sizes() == q.sizes());
      CHECK(out.k.sizes() == k.sizes());
      CHECK(rel(out.q, q) < tol(dtype));
      CHECK(rel(out.k, k) < tol(dtype));
      CHECK(rel(out.v, v) == 0.0);
      CHECK(rel(qkv.grad(), xr.grad()) < tol(dtype));
      if (rep == 1 && !with_rope) CHECK(out.q.data_ptr() == qkv.data_ptr());  // views, no copies
      qkv.mutable_grad().reset();
     }
    }
  }
}

TEST_CASE("cross-entropy kernels = LibTorch's cross_entropy on fp32 logits, loss and gradient", "[kernels][gpu]") {
  if (!have_gpu()) return;
  me::parallel::TensorParallel no_tp;
  for (auto dtype : {torch::kBFloat16, torch::kFloat}) {
    for (int64_t vocab : {256, 97}) {  // vectorised and scalar paths
      INFO("dtype " << dtype << ", vocab " << vocab);
      torch::manual_seed(3);
      auto logits = (3 * torch::randn({4, 33, vocab}, kGpu)).to(dtype).requires_grad_(true);
      auto labels = torch::randint(0, vocab, {4, 33}, torch::TensorOptions().dtype(torch::kLong).device(kGpu));
      labels.index_put_({0, torch::indexing::Slice(0, 5)}, -100);  // ignored positions
      // The fused path consumes its input (the gradient is written over it): give it a copy.
      auto input = logits.detach().clone().requires_grad_(true);
      auto loss = me::parallel::vocab_parallel_cross_entropy(input * 1, labels, no_tp);
      loss.backward();
      auto lr = logits.detach().to(torch::kFloat).requires_grad_(true);
      auto ref = torch::nn::functional::cross_entropy(
          lr.view({-1, vocab}), labels.view({-1}), torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
      ref.backward();
      CHECK(loss.item<double>() == Approx(ref.item<double>()).epsilon(dtype == torch::kFloat ? 1e-5 : 1e-3));
      CHECK(rel(input.grad(), lr.grad()) < tol(dtype));
      CHECK(input.grad().index({0, torch::indexing::Slice(0, 5)}).abs().max().item<double>() == 0.0);
    }
  }
}

TEST_CASE("multi-tensor AdamW kernel = the foreach AdamW, with clipping, the bf16 write-back and bf16 gradients",
          "[kernels][gpu]") {
  if (!have_gpu()) return;
  torch::manual_seed(4);
  const std::vector<int64_t> sizes = {70000, 5, 131072, 3000};
  me::optim::OptimizerOptions cfg;  // betas 0.9, 0.95; eps 1e-8; weight decay 0.1
  std::vector<torch::Tensor> p, g, m, v, pr, mr, vr, model;
  std::vector<kernels::MultiTensorAdamW::Entry> entries;
  double sq_ref = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    p.push_back(torch::randn({sizes[k]}, kGpu));
    g.push_back(0.1 * torch::randn({sizes[k]}, kGpu));
    if (k == 2) g.back() = g.back().to(torch::kBFloat16);  // parallel.grad_reduce_dtype = "bf16"
    m.push_back(torch::zeros({sizes[k]}, kGpu));
    v.push_back(torch::zeros({sizes[k]}, kGpu));
    pr.push_back(p.back().clone()), mr.push_back(m.back().clone()), vr.push_back(v.back().clone());
    model.push_back(p.back().to(torch::kBFloat16));
    const bool in_norm = k != 1;
    if (in_norm) sq_ref += g.back().to(torch::kDouble).pow(2).sum().item<double>();
    entries.push_back({p[k], g[k], m[k], v[k], k % 2 ? torch::Tensor() : model[k], k % 2 ? 0.0 : 0.1, in_norm});
  }
  kernels::MultiTensorAdamW fused(entries);
  const double sq = fused.grad_sum_squares().item<double>();
  CHECK(sq == Approx(sq_ref).epsilon(1e-12));
  CHECK(fused.grad_sum_squares().item<double>() == sq);  // bitwise repeatable
  for (int64_t step = 1; step <= 3; ++step) {
    fused.step(1e-2, cfg.betas[0], cfg.betas[1], cfg.eps, step, 0.5);
    for (size_t k = 0; k < sizes.size(); ++k) {
      std::vector<torch::Tensor> P{pr[k]}, G{g[k].to(torch::kFloat) * 0.5}, M{mr[k]}, V{vr[k]};
      me::optim::adamw_update(P, G, M, V, 1e-2, k % 2 ? 0.0 : 0.1, cfg, step);
    }
  }
  for (size_t k = 0; k < sizes.size(); ++k) {
    INFO("tensor " << k);
    CHECK(rel(p[k], pr[k]) < 1e-6);
    CHECK(rel(m[k], mr[k]) < 1e-6);
    CHECK(rel(v[k], vr[k]) < 1e-6);
    if (k % 2 == 0) CHECK(torch::equal(model[k], p[k].to(torch::kBFloat16)));
  }
}

TEST_CASE("residual add + norm kernel = x + delta then layer_norm / rms_norm, forward and backward",
          "[kernels][gpu]") {
  if (!have_gpu()) return;
  for (bool rms : {false, true}) {
    for (auto dtype : {torch::kBFloat16, torch::kFloat}) {
      for (int64_t hidden : {2048, 1000, 64}) {
        INFO((rms ? "rms" : "layer") << "norm, dtype " << dtype << ", hidden " << hidden);
        torch::manual_seed(2);
        auto x = torch::randn({3, 37, hidden}, kGpu).to(dtype).requires_grad_(true);
        auto delta = torch::randn({3, 37, hidden}, kGpu).to(dtype).requires_grad_(true);
        auto w = (1 + 0.1 * torch::randn({hidden}, kGpu)).to(dtype).requires_grad_(true);
        auto b = rms ? torch::Tensor() : (0.1 * torch::randn({hidden}, kGpu)).to(dtype).requires_grad_(true);
        REQUIRE(kernels::add_norm_fits(x, delta, w, b));
        auto out = kernels::add_norm(x, delta, w, b, 1e-5, rms);
        auto d_sum = torch::randn_like(x), d_y = torch::randn_like(x);
        torch::autograd::backward({out.sum, out.y}, {d_sum, d_y});
        // The composition in fp32 from the same inputs (the sum rounded as the kernel's is).
        auto xr = x.detach().to(torch::kFloat).requires_grad_(true);
        auto dr = delta.detach().to(torch::kFloat).requires_grad_(true);
        auto wr = w.detach().to(torch::kFloat).requires_grad_(true);
        auto br = rms ? torch::Tensor() : b.detach().to(torch::kFloat).requires_grad_(true);
        auto sr = (xr + dr).to(dtype).to(torch::kFloat);
        auto yr = rms ? sr * torch::rsqrt(sr.pow(2).mean(-1, true) + 1e-5) * wr
                      : torch::layer_norm(sr, {hidden}, wr, br, 1e-5);
        torch::autograd::backward({sr, yr}, {d_sum.to(torch::kFloat), d_y.to(torch::kFloat)});
        CHECK(out.y.scalar_type() == dtype);
        CHECK(rel(out.sum, sr) < tol(dtype));
        CHECK(rel(out.y, yr) < tol(dtype));
        CHECK(rel(x.grad(), xr.grad()) < tol(dtype));
        CHECK(rel(delta.grad(), dr.grad()) < tol(dtype));
        CHECK(rel(w.grad(), wr.grad()) < 2 * tol(dtype));
        if (!rms) CHECK(rel(b.grad(), br.grad()) < 2 * tol(dtype));
      }
    }
  }
}

TEST_CASE("the tensor-parallel chunks' GEMMs through cuBLASLt = LibTorch's mm, on row ranges of wider outputs", "[kernels][gpu]") {
  // Never on CPU tensors (nor without the kernels): the callers run LibTorch's mm there.
  const auto cpu = torch::ones({8, 16}, torch::kBFloat16);
  CHECK_FALSE(kernels::linear_rows_into(cpu, torch::ones({8, 16}, torch::kBFloat16), {}, torch::empty({8, 8}, torch::kBFloat16)));
  CHECK_FALSE(kernels::input_grad_rows_into(cpu, torch::ones({16, 8}, torch::kBFloat16), torch::empty({8, 8}, torch::kBFloat16)));
  if (!have_gpu()) return;
  const auto bf16 = torch::kBFloat16;
  torch::manual_seed(5);
  const auto x = torch::randn({96, 64}, kGpu).to(bf16), w = (torch::randn({48, 64}, kGpu) * 0.1).to(bf16);
  const auto b = torch::randn({48}, kGpu).to(bf16), dy = torch::randn({96, 48}, kGpu).to(bf16);
  REQUIRE(kernels::use(kernels::Op::chunk_gemm, x));
  for (bool bias : {true, false}) {
    INFO("bias " << bias);
    // rows 32..63 of x, into rows 32..63 of a wider buffer (a chunk's output among the others')
    auto wide = torch::zeros({96, 56}, kGpu).to(bf16);
    auto into = wide.narrow(0, 32, 32).narrow(1, 0, 48);
    REQUIRE(kernels::linear_rows_into(x.narrow(0, 32, 32), w, bias ? b : torch::Tensor(), into));
    auto want = torch::mm(x.narrow(0, 32, 32).to(torch::kFloat), w.to(torch::kFloat).t());
    if (bias) want = want + b.to(torch::kFloat);
    CHECK(rel(into, want) < tol(bf16));
    CHECK(wide.narrow(0, 0, 32).abs().max().item<float>() == 0.f);  // the other rows untouched
    CHECK(wide.narrow(1, 48, 8).abs().max().item<float>() == 0.f);
  }
  auto dx = torch::zeros({96, 64}, kGpu).to(bf16);
  REQUIRE(kernels::input_grad_rows_into(dy.narrow(0, 64, 32), w, dx.narrow(0, 64, 32)));
  CHECK(rel(dx.narrow(0, 64, 32), torch::mm(dy.narrow(0, 64, 32).to(torch::kFloat), w.to(torch::kFloat))) < tol(bf16));
  CHECK(dx.narrow(0, 0, 64).abs().max().item<float>() == 0.f);
  // Not taken (false, nothing written) where cuBLASLt's 16-byte rows do not hold: a width of 50.
  CHECK_FALSE(kernels::linear_rows_into(x, torch::ones({50, 64}, kGpu).to(bf16), {}, torch::empty({96, 50}, kGpu).to(bf16)));
}

TEST_CASE("the GEMM candidates tried in the step: round robin, least median, the first kept near a tie", "[kernels]") {
  using me::kernels::CandidateChoice;
  // Times per candidate as the step would give them (ms), with one slow outlier each for the
  // medians to shed.
  auto run = [](CandidateChoice& choice, const std::vector<std::vector<float>>& times) {
    std::vector<int> taken(times.size(), 0), order;
    for (int call = 0; call < 100 && !choice.all_read(); ++call) {
      const int c = choice.take_next();
      if (c < 0) break;
      order.push_back(c);
      choice.record(c, times[size_t(c)][size_t(taken[size_t(c)]++)]);
    }
    return order;
  };
  {
    CandidateChoice choice(3);
    const auto order = run(choice, {{10, 30, 10}, {9, 9, 40}, {12, 12, 12}});
    const std::vector<int> in_turn{0, 1, 2, 0, 1, 2, 0, 1, 2};  // kSamples (3) each
    CHECK(order == in_turn);
    CHECK(choice.take_next() == -1);                             // every sample taken
    REQUIRE(choice.all_read());
    CHECK_FALSE(choice.settled());
    choice.settle();
    CHECK(choice.chosen() == 1);  // median 9 against the first's 10
    CHECK(choice.median(0) == 10.f);
  }
  {
    CandidateChoice choice(2);  // 1% faster: the heuristic's first stays
    run(choice, {{10, 10, 10}, {9.9f, 9.9f, 9.9f}});
    choice.settle();
    CHECK(choice.chosen() == 0);
  }
  {
    CandidateChoice choice(3);  // a refused candidate is never taken again, nor chosen
    CHECK(choice.take_next() == 0);
    CHECK(choice.take_next() == 1);
    choice.refuse(1);
    choice.untake(0);  // the call of candidate 0 was not timed after all
    const auto order = run(choice, {{5, 5, 5}, {1, 1, 1}, {6, 6, 6}});
    CHECK(std::count(order.begin(), order.end(), 1) == 0);
    CHECK(std::count(order.begin(), order.end(), 0) == CandidateChoice::kSamples);
    choice.settle();
    CHECK(choice.chosen() == 0);
  }
  {
    CandidateChoice choice(2);  // the first refused: the other, whatever its time
    choice.refuse(0);
    run(choice, {{1, 1, 1}, {50, 50, 50}});
    choice.settle();
    CHECK(choice.chosen() == 1);
  }
}

TEST_CASE("weight gradients through cuBLASLt = dy^T x, written or added into fp32 and bf16 main grads", "[kernels][gpu]") {
  const auto bf16 = torch::kBFloat16;
  CHECK_FALSE(kernels::weight_grad_into(torch::zeros({8, 16}), torch::ones({4, 8}, bf16), torch::ones({4, 16}, bf16), false));
  if (!have_gpu()) return;
  // The candidates timed (opt-in), for as long as this test runs: the timing's path is checked too.
  struct TimedGemms {
    std::string before = std::getenv("ME_GEMM_AUTOTUNE") ? std::getenv("ME_GEMM_AUTOTUNE") : "";
    TimedGemms() { setenv("ME_GEMM_AUTOTUNE", "1", 1); }
    ~TimedGemms() { before.empty() ? unsetenv("ME_GEMM_AUTOTUNE") : setenv("ME_GEMM_AUTOTUNE", before.c_str(), 1); }
  } timed;
  torch::manual_seed(9);
  // dy's rows sit in a wider buffer (a chunk among others); shapes large enough that cuBLASLt
  // offers several candidates, which the calls of each shape take in turn (gemm_trial.h).
  const auto wide = torch::randn({384, 200}, kGpu).to(bf16);
  const auto dy = wide.narrow(1, 0, 192), x = torch::randn({384, 256}, kGpu).to(bf16);
  const auto want = torch::mm(dy.to(torch::kFloat).t(), x.to(torch::kFloat));
  REQUIRE(kernels::use(kernels::Op::wgrad_gemm, dy));
  for (auto dtype : {torch::kFloat, bf16}) {
    INFO("main grad " << dtype);
    auto main = torch::full({192, 256}, 7.f, kGpu).to(dtype);
    REQUIRE(kernels::weight_grad_into(main, dy, x, /*accumulate=*/false));
    CHECK(rel(main, want) < tol(dtype == torch::kFloat ? torch::kFloat : bf16));
    const auto before = main.to(torch::kFloat).clone();  // .to() of an fp32 tensor is the tensor itself
    REQUIRE(kernels::weight_grad_into(main, dy, x, /*accumulate=*/true));
    CHECK(rel(main, before + want) < tol(dtype == torch::kFloat ? torch::kFloat : bf16));
    REQUIRE(kernels::weight_grad_into(main, dy, x, /*accumulate=*/true));  // the kept plan, again
    CHECK(rel(main, before + 2 * want) < tol(dtype == torch::kFloat ? torch::kFloat : bf16));
  }
  // Not taken (false, nothing written): a main grad of another shape, or not contiguous.
  auto other = torch::zeros({192, 128}, kGpu);
  CHECK_FALSE(kernels::weight_grad_into(other, dy, x, false));
  CHECK_FALSE(kernels::weight_grad_into(torch::zeros({256, 192}, kGpu).t(), dy, x, false));
  // Every candidate the trial takes computes the same product: calls enough for every candidate's
  // samples (up to 8 candidates x CandidateChoice::kSamples, 3; each call waits for the GPU in rel(), so
  // the samples are read as the trial goes).
  auto out = torch::empty({192, 256}, kGpu);
  for (int call = 0; call < 40; ++call) {
    INFO("call " << call);
    REQUIRE(kernels::weight_grad_into(out, dy, x, /*accumulate=*/false));
    CHECK(rel(out, want) < tol(torch::kFloat));
  }
  CHECK_THAT(kernels::gemm_autotune_summary(), Catch::Contains("candidates timed in the step"));
}

TEST_CASE("GeLU in the GEMM epilogues = linear, tanh GeLU, linear: output and every gradient", "[kernels][gpu]") {
  if (!have_gpu()) return;
  const auto bf16 = torch::kBFloat16;
  for (bool bias : {true, false}) {
    INFO("bias " << bias);
    torch::manual_seed(3);
    me::parallel::ColumnParallelLinear fc1(64, 256, bias, me::parallel::TensorParallel{});
    me::parallel::RowParallelLinear fc2(256, 64, bias, me::parallel::TensorParallel{});
    {
      torch::NoGradGuard no_grad;
      for (auto* p : {&fc1->weight, &fc2->weight}) p->normal_(0.0, 0.08);
      if (bias) fc1->bias.normal_(0.0, 0.5), fc2->bias.normal_(0.0, 0.5);
    }
    fc1->to(kGpu, bf16);
    fc2->to(kGpu, bf16);
    auto x = torch::randn({3, 37, 64}, kGpu).to(bf16).requires_grad_(true);
    REQUIRE(kernels::use(kernels::Op::gemm_gelu, x));
    auto a = fc1->forward_gelu(x);
    REQUIRE(a.out.defined());  // the epilogue path, not the composition
    CHECK_FALSE(a.out.requires_grad());
    auto y = fc2->forward_gelu(a);
    auto dy = torch::randn_like(y);
    y.backward(dy);
    // The composition in fp32 from the same bf16 values.
    auto f32 = [](const torch::Tensor& t) {
      return t.defined() ? t.detach().to(torch::kFloat).requires_grad_(true) : torch::Tensor();
    };
    auto xr = f32(x), w1 = f32(fc1->weight), b1 = f32(fc1->bias), w2 = f32(fc2->weight), b2 = f32(fc2->bias);
    auto pre = torch::nn::functional::linear(xr, w1, b1);
    auto yr = torch::nn::functional::linear(torch::gelu(pre, "tanh"), w2, b2);
    yr.backward(dy.to(torch::kFloat));
    CHECK(rel(a.pre, pre) < tol(bf16));
    CHECK(rel(a.out, torch::gelu(pre, "tanh")) < tol(bf16));
    CHECK(rel(y, yr) < tol(bf16));
    CHECK(rel(x.grad(), xr.grad()) < tol(bf16));
    CHECK(rel(fc1->weight.grad(), w1.grad()) < tol(bf16));
    CHECK(rel(fc2->weight.grad(), w2.grad()) < tol(bf16));
    if (bias) {
      CHECK(rel(fc1->bias.grad(), b1.grad()) < tol(bf16));
      CHECK(rel(fc2->bias.grad(), b2.grad()) < tol(bf16));
    }
  }
}

namespace {
// fp32 on both sides: the GPU paths (engine kernels, the bias GEMM epilogue) against the CPU's
// LibTorch compositions; the loss and every parameter's gradient.
void check_model_gpu_matches_cpu(const me::model::TransformerConfig& config) {
  me::model::Transformer cpu(config), gpu(config);
  {
    // Biases start at zero and norm weights at one: random ones, so they are checked too.
    torch::NoGradGuard no_grad;
    torch::manual_seed(5);
    auto to = gpu->named_parameters();
    for (const auto& item : cpu->named_parameters()) {
      const auto& name = item.key();
      const bool bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
      const bool norm = name.find("norm") != std::string::npos;
      if (!bias && !norm) continue;
      if (bias) item.value().normal_(0.0, 0.1);
      else item.value().normal_(1.0, 0.1);
      to[name].copy_(item.value());
    }
  }
  gpu->to(kGpu);
  torch::manual_seed(6);
  const int64_t v = config.vocab, s = config.seq;
  auto tokens = torch::randint(0, v, {3, s}, torch::kLong), labels = torch::randint(0, v, {3, s}, torch::kLong);
  auto lc = cpu->loss(tokens, labels);
  lc.backward();
  auto lg = gpu->loss(tokens.to(kGpu), labels.to(kGpu));
  lg.backward();
  CHECK(lg.item<double>() == Approx(lc.item<double>()).epsilon(1e-5));
  auto pc = cpu->named_parameters(), pg = gpu->named_parameters();
  for (const auto& item : pc) {
    INFO(item.key());
    CHECK(rel(pg[item.key()].grad(), item.value().grad()) < 1e-4);
  }
}
}  // namespace

TEST_CASE("a LLaMA-style model with the kernels on the GPU = the compositions on the CPU", "[kernels][gpu]") {
  if (!have_gpu()) return;
  check_model_gpu_matches_cpu(tiny_llama());  // RoPE, SwiGLU, cross entropy
}

TEST_CASE("a GPT-style model with the kernels on the GPU = the compositions on the CPU", "[kernels][gpu]") {
  if (!have_gpu()) return;
  // Biases through the GEMM epilogue (linear_bias), the QKV split without RoPE, tied embeddings.
  check_model_gpu_matches_cpu(tiny(me::model::TransformerConfig::gpt(), 4));
}

namespace {
// Loss and every gradient of `config` in bf16 on the GPU, from the same weights and batch.
std::vector<torch::Tensor> loss_and_grads(me::model::Transformer& model, const torch::Tensor& tokens,
                                          const torch::Tensor& labels) {
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  auto loss = model->loss(tokens, labels);
  loss.backward();
  std::vector<torch::Tensor> out{loss.detach().clone()};
  for (const auto& p : model->parameters()) out.push_back(p.grad().clone());
  return out;
}
}  // namespace

#if ME_HAS_SDPA_GQA && ME_TORCH_HAS_CUDA
TEST_CASE("deterministic mode's attention: cuDNN's forward with FlashAttention's backward matches LibTorch's own",
          "[kernels][gpu][determinism]") {
  if (!have_gpu()) return;
  torch::manual_seed(11);
  const auto opts = torch::TensorOptions().device(kGpu).dtype(torch::kBFloat16);
  // [batch, heads, seq, head_dim] views of [batch, seq, heads, head_dim], as the model hands them over
  auto heads_view = [&] { return torch::randn({2, 512, 8, 128}, opts).transpose(1, 2); };
  const auto q0 = heads_view(), k0 = heads_view(), v0 = heads_view(), go = heads_view();
  auto run = [&] {
    auto q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(), v = v0.clone().requires_grad_();
    auto out = me::compat::causal_attention(q, k, v);
    out.backward(go);
    return std::vector<torch::Tensor>{out, q.grad(), k.grad(), v.grad()};
  };
  const auto plain = run();  // LibTorch's choice (cuDNN or flash), not deterministic mode
  at::globalContext().setDeterministicAlgorithms(true, false);
  REQUIRE(me::compat::use_cudnn_forward_flash_backward(q0, k0));
  const auto first = run(), second = run();
  at::globalContext().setDeterministicAlgorithms(false, false);
  CHECK_FALSE(me::compat::cudnn_forward_refused().load());  // the pair ran, not the fallback
  const char* what[] = {"output", "dq", "dk", "dv"};
  for (size_t i = 0; i < plain.size(); ++i) {
    INFO(what[i]);
    CHECK(torch::equal(first[i], second[i]));
    const double err = (first[i].to(torch::kFloat) - plain[i].to(torch::kFloat)).abs().max().item<double>();
    const double scale = plain[i].to(torch::kFloat).abs().max().item<double>();
    CHECK(err <= 2e-2 * scale);  // two bf16 kernels' rounding, not a wrong statistic (that gives O(1))
  }
}
#endif

TEST_CASE("deterministic mode: the fused kernels, attention and the whole model give the same bits twice",
          "[kernels][gpu][determinism]") {
  if (!have_gpu()) return;
  me::apply_deterministic_mode();
  for (auto config : {tiny(me::model::TransformerConfig::gpt(), 4), tiny_llama()}) {
    // Big enough for several thread blocks per reduction (the norms' weight gradients, the
    // attention backward over 256 positions, the cross entropy's rows).
    config.vocab = 1000;
    config.seq = 256;
    config.hidden = 256;
    me::model::Transformer model(config);
    model->to(kGpu, torch::kBFloat16);
    torch::manual_seed(7);
    auto tokens = torch::randint(0, config.vocab, {4, config.seq}, torch::kLong).to(kGpu);
    auto labels = torch::randint(0, config.vocab, {4, config.seq}, torch::kLong).to(kGpu);
    const auto first = loss_and_grads(model, tokens, labels), second = loss_and_grads(model, tokens, labels);
    INFO(config.activation);
    REQUIRE(first.size() == second.size());
    CHECK(torch::equal(first[0], second[0]));
    const auto names = model->named_parameters().keys();
    for (size_t i = 1; i < first.size(); ++i) {
      INFO(names[i - 1]);
      CHECK(torch::equal(first[i], second[i]));
    }
  }
  at::globalContext().setDeterministicAlgorithms(false, false);
}
