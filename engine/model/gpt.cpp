#include "engine/model/gpt.h"

#include <cmath>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/torch_compat.h"

namespace me::model {

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& cfg)
    : heads_(cfg.heads), head_dim_(cfg.head_dim()) {
  qkv_ = register_module("qkv", torch::nn::Linear(cfg.hidden, 3 * cfg.hidden));
  proj_ = register_module("proj", torch::nn::Linear(cfg.hidden, cfg.hidden));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const auto b = x.size(0), s = x.size(1);
  // [b, s, 3h] -> three [b, heads, s, head_dim]
  auto qkv = qkv_->forward(x).view({b, s, 3, heads_, head_dim_}).permute({2, 0, 3, 1, 4});
  auto y = compat::causal_attention(qkv[0], qkv[1], qkv[2]);
  y = y.transpose(1, 2).reshape({b, s, heads_ * head_dim_});
  return proj_->forward(y);
}

MLPImpl::MLPImpl(const GPTConfig& cfg) {
  fc1_ = register_module("fc1", torch::nn::Linear(cfg.hidden, cfg.ffn()));
  fc2_ = register_module("fc2", torch::nn::Linear(cfg.ffn(), cfg.hidden));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  // tanh-approximated GeLU, as GPT-2 and Megatron's default bias-gelu use.
  return fc2_->forward(torch::gelu(fc1_->forward(x), "tanh"));
}

BlockImpl::BlockImpl(const GPTConfig& cfg) {
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
  attn_ = register_module("attn", CausalSelfAttention(cfg));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
  mlp_ = register_module("mlp", MLP(cfg));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto h = x + attn_->forward(ln1_->forward(x));
  return h + mlp_->forward(ln2_->forward(h));
}

GPTImpl::GPTImpl(const GPTConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  wte_ = register_module("wte", torch::nn::Embedding(cfg.vocab, cfg.hidden));
  wpe_ = register_module("wpe", torch::nn::Embedding(cfg.seq, cfg.hidden));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.layers; ++i) blocks_->push_back(Block(cfg));
  ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
  if (!cfg.tie_embeddings)
    head_ = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(cfg.hidden, cfg.vocab).bias(false)));
  reset_parameters(0);
}

torch::Tensor GPTImpl::forward(const torch::Tensor& tokens) {
  ME_CHECK(tokens.dim() == 2, "GPT expects tokens of shape [batch, seq], got ", tokens.sizes());
  const auto s = tokens.size(1);
  ME_CHECK(s <= cfg_.seq, "GPT: sequence of ", s, " tokens is longer than model.seq = ", cfg_.seq);
  auto pos = torch::arange(s, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
  auto x = wte_->forward(tokens) + wpe_->forward(pos);
  for (const auto& block : *blocks_) x = block->as<Block>()->forward(x);
  x = ln_f_->forward(x);
  // Tied head: the output projection is the token embedding, as in GPT-2 and Megatron.
  return cfg_.tie_embeddings ? torch::matmul(x, wte_->weight.t()) : head_->forward(x);
}

torch::Tensor GPTImpl::loss(const torch::Tensor& tokens, const torch::Tensor& labels) {
  auto logits = forward(tokens);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                              labels.reshape({-1}));
}

int64_t GPTImpl::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

void GPTImpl::reset_parameters(uint64_t seed) {
  // Drawn on a CPU generator of our own, in registration order, then copied to wherever
  // the parameter lives: the same seed gives the same weights on CPU and GPU.
  auto gen = at::detail::createCPUGenerator(seed);
  const double out_std = cfg_.init_std / std::sqrt(2.0 * static_cast<double>(cfg_.layers));
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    torch::Tensor value = torch::empty(p.sizes(), torch::kFloat);
    const bool is_norm = name.find("ln") != std::string::npos;
    if (ends_with("bias"))
      value.zero_();
    else if (is_norm)
      value.fill_(1.0);
    else  // output projections of residual branches get the GPT-2 / Megatron scaled init
      value.normal_(0.0, ends_with("proj.weight") || ends_with("fc2.weight") ? out_std : cfg_.init_std, gen);
    p.copy_(value);
  }
}

namespace {

std::string shape_string(const torch::Tensor& t) {
  std::ostringstream os;
  os << "[";
  for (int64_t i = 0; i < t.dim(); ++i) os << (i ? ", " : "") << t.size(i);
  os << "]";
  return os.str();
}

std::string with_commas(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

int64_t count(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

void describe_into(std::ostringstream& os, const std::string& name, const torch::nn::Module& m, int depth) {
  const std::string pad(static_cast<size_t>(2 * depth), ' ');
  os << pad << (name.empty() ? "" : name + ": ") << m.name();
  for (const auto& p : m.named_parameters(/*recurse=*/false)) os << "  " << p.key() << " " << shape_string(p.value());
  os << "  (" << with_commas(count(m)) << ")\n";
  const auto children = m.named_children();
  // Repeated identical blocks (48 layers...) print once, with their multiplicity.
  for (size_t i = 0; i < children.size();) {
    size_t j = i + 1;
    while (j < children.size() && children[j].value()->name() == children[i].value()->name() &&
           count(*children[j].value()) == count(*children[i].value()))
      ++j;
    const std::string label = j - i > 1 ? cat(children[i].key(), "..", children[j - 1].key(), " (", j - i, "x)")
                                         : children[i].key();
    describe_into(os, label, *children[i].value(), depth + 1);
    i = j;
  }
}

}  // namespace

std::string describe_module(const torch::nn::Module& module) {
  std::ostringstream os;
  describe_into(os, "", module, 0);
  os << "total parameters: " << with_commas(count(module));
  return os.str();
}

std::vector<int64_t> generate(GPT& model, std::vector<int64_t> tokens, int64_t count, int64_t top_k,
                              double temperature, uint64_t seed) {
  ME_CHECK(!tokens.empty(), "generate: the prompt must hold at least one token");
  ME_CHECK(top_k >= 1, "generate: top_k must be >= 1, got ", top_k);
  ME_CHECK(temperature > 0, "generate: temperature must be > 0, got ", temperature);
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  auto gen = at::detail::createCPUGenerator(seed);
  const auto device = model->parameters().front().device();
  const int64_t ctx = model->config().seq;
  for (int64_t i = 0; i < count; ++i) {
    const size_t start = tokens.size() > static_cast<size_t>(ctx) ? tokens.size() - static_cast<size_t>(ctx) : 0;
    std::vector<int64_t> window(tokens.begin() + static_cast<std::ptrdiff_t>(start), tokens.end());
    auto input = torch::tensor(window, torch::kLong).view({1, -1}).to(device);
    auto logits = model->forward(input).select(1, -1).squeeze(0).to(torch::kCPU, torch::kFloat) / temperature;
    const int64_t k = std::min<int64_t>(top_k, logits.size(0));
    auto top = logits.topk(k);
    auto probs = torch::softmax(std::get<0>(top), -1);
    const int64_t pick = torch::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
    tokens.push_back(std::get<1>(top)[pick].item<int64_t>());
  }
  if (was_training) model->train();
  return tokens;
}

}  // namespace me::model
