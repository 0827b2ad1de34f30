#include "engine/model/transformer.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "engine/core/autograd_state.h"
#include "engine/core/error.h"
#include "engine/core/torch_compat.h"
#include "engine/model/block_graphs.h"
#include "engine/kernels/fp8_linear.h"
#include "engine/kernels/fused_ops.h"
#include "engine/parallel/main_grad.h"
#include "engine/parallel/mappings.h"

namespace me::model {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// Activation recomputation: run the wrapped function without keeping its activations, and
// again (with grad) during backward. The function belongs to a module that outlives the
// graph; backward finds it in saved_data.
using BlockFn = std::function<Residual(const Residual&)>;
using Fn3 = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

// A whole block: the residual stream in (one tensor, the sum: what is kept until backward) and
// out as {x, delta}.
struct RecomputeBlock : public torch::autograd::Function<RecomputeBlock> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& stream, const BlockFn* fn) {
    save_state(ctx, "fn", fn);
    ctx->save_for_backward({stream});
    // fp8 with delayed scales: the recomputation casts with the scales this run used
    auto tape = std::make_shared<kernels::Fp8RecomputeTape>();
    save_state(ctx, "fp8_tape", tape);
    kernels::Fp8RecomputeTape::Scope recording(*tape, kernels::Fp8RecomputeTape::Mode::record);
    auto out = (*fn)(Residual{stream, {}});
    return {out.x, out.delta};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto stream = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    Residual out;
    {
      torch::AutoGradMode enable(true);
      const auto& tape = saved_state<std::shared_ptr<kernels::Fp8RecomputeTape>>(ctx, "fp8_tape");
      kernels::Fp8RecomputeTape::Scope replaying(*tape, kernels::Fp8RecomputeTape::Mode::replay);
      out = (*saved_state<const BlockFn*>(ctx, "fn"))(Residual{stream, {}});
    }
    parallel::WeightGradsInline inline_wgrads;  // held back, they would keep the rebuilt activations
    torch::autograd::backward({out.x, out.delta}, {grads[0], grads[1]});
    return {stream.grad(), torch::Tensor()};
  }
};

struct Recompute3 : public torch::autograd::Function<Recompute3> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b,
                               const torch::Tensor& c, const Fn3* fn) {
    save_state(ctx, "fn", fn);
    ctx->save_for_backward({a, b, c});
    return (*fn)(a, b, c);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    std::vector<torch::Tensor> in;
    for (auto& s : saved) in.push_back(s.detach().requires_grad_(true));
    torch::Tensor y;
    {
      torch::AutoGradMode enable(true);
      y = (*saved_state<const Fn3*>(ctx, "fn"))(in[0], in[1], in[2]);
    }
    // The attention core has no parameters: take the input gradients as autograd makes them
    // (a leaf's .grad() would be re-laid out, and later sums would round differently).
    auto g = torch::autograd::grad({y}, {in[0], in[1], in[2]}, {grads[0]});
    return {g[0], g[1], g[2], torch::Tensor()};
  }
};

uint64_t mix(uint64_t seed, const std::string& name) {  // FNV-1a of the name, then the seed
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ULL;
  return h ^ (seed * 0x9e3779b97f4a7c15ULL);
}

// Fills a contiguous fp32 CPU tensor with N(0, std) values drawn in chunks of 2^20 elements, each
// from its own generator seeded by (seed, chunk): the chunks fill in parallel (LibTorch's CPU
// sampling is serial), and the values depend on the seed and the size alone, not on the thread count.
void seeded_normal_(torch::Tensor& out, double std, uint64_t seed) {
  auto flat = out.view({-1});
  const int64_t n = flat.numel(), chunk = int64_t{1} << 20, chunks = (n + chunk - 1) / chunk;
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      auto gen = at::detail::createCPUGenerator(seed ^ (static_cast<uint64_t>(c) * 0xbf58476d1ce4e5b9ULL));
      flat.narrow(0, c * chunk, std::min(chunk, n - c * chunk)).normal_(0.0, std, gen);
    }
  });
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

AttentionImpl::AttentionImpl(const TransformerConfig& c, TensorParallel tp, std::shared_ptr<parallel::Rotary> rope)
    : heads_(c.heads / tp.size()),
      groups_(c.groups() / tp.size()),
      head_dim_(c.head_dim()),
      selective_recompute_(c.recompute == "selective"),
      rope_(std::move(rope)) {
  const int64_t d = c.head_dim();
  qkv_ = register_module("qkv", parallel::ColumnParallelLinear(c.hidden, (c.heads + 2 * c.groups()) * d, c.bias, tp));
  proj_ = register_module("proj", parallel::RowParallelLinear(c.heads * d, c.hidden, c.bias, tp));
  core_fn_ = [this](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) { return core(q, k, v); };
}

torch::Tensor AttentionImpl::core(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return compat::causal_attention(q, k, v);  // grouped-query when k, v have fewer heads
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x) {
  // [b, s, groups * (rep + 2) * d] -> per group: rep query heads, a key, a value
  const int64_t rep = heads_ / groups_;
  auto qkv = qkv_->forward(x);
  const int64_t b = qkv.size(0), s = qkv.size(1);
  torch::Tensor q, k, v;
  if (kernels::use(kernels::Op::rotary, qkv)) {
    // Split (and rotate) forward, rotate back and assemble the QKV gradient backward: one pass each.
    auto split = rope_ ? kernels::split_qkv(qkv, groups_, rep, head_dim_, rope_->cos_half(qkv.device()),
                                            rope_->sin_half(qkv.device()))
                       : kernels::split_qkv(qkv, groups_, rep, head_dim_);
    q = split.q, k = split.k, v = split.v;
  } else {
    auto qkv5 = qkv.view({b, s, groups_, rep + 2, head_dim_});
    q = qkv5.narrow(3, 0, rep).reshape({b, s, heads_, head_dim_}).transpose(1, 2);  // [b, heads, s, d]
    k = qkv5.select(3, rep).transpose(1, 2);                                       // [b, groups, s, d]
    v = qkv5.select(3, rep + 1).transpose(1, 2);
    if (rope_) {
      q = rope_->apply(q);
      k = rope_->apply(k);
    }
  }
  auto y = selective_recompute_ && q.requires_grad()
               ? Recompute3::apply(q, k, v, &core_fn_)
               : core(q, k, v);
  y = y.transpose(1, 2).reshape({y.size(0), y.size(2), heads_ * head_dim_});
  return proj_->forward(y);
}

MLPImpl::MLPImpl(const TransformerConfig& c, TensorParallel tp) : swiglu_(c.activation == "swiglu") {
  if (swiglu_) {
    gate_up_ = register_module("gate_up", parallel::ColumnParallelLinear(c.hidden, 2 * c.ffn(), c.bias, tp));
    down_ = register_module("down", parallel::RowParallelLinear(c.ffn(), c.hidden, c.bias, tp));
  } else {
    fc1_ = register_module("fc1", parallel::ColumnParallelLinear(c.hidden, c.ffn(), c.bias, tp));
    fc2_ = register_module("fc2", parallel::RowParallelLinear(c.ffn(), c.hidden, c.bias, tp));
  }
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  if (swiglu_) {
    auto h = gate_up_->forward(x);
    if (kernels::use(kernels::Op::swiglu, h)) return down_->forward(kernels::swiglu(h));
    auto pairs = h.view({h.size(0), h.size(1), h.size(2) / 2, 2});  // [..., f, (gate, up)]
    return down_->forward(torch::silu(pairs.select(3, 0)) * pairs.select(3, 1));
  }
  // tanh-approximated GeLU, as GPT-2 and Megatron's bias-gelu use.
  // On the GPU inside the two GEMMs' epilogues (forward fc1, backward fc2's input gradient).
  return fc2_->forward_gelu(fc1_->forward_gelu(x));
}

BlockImpl::BlockImpl(const TransformerConfig& c, TensorParallel tp, std::shared_ptr<parallel::Rotary> rope, bool recompute)
    : recompute_(recompute) {
  norm1_ = register_module("norm1", parallel::Norm(c.norm, c.hidden, c.norm_eps));
  attn_ = register_module("attn", Attention(c, tp, rope));
  norm2_ = register_module("norm2", parallel::Norm(c.norm, c.hidden, c.norm_eps));
  mlp_ = register_module("mlp", MLP(c, tp));
  body_fn_ = [this](const Residual& in) { return body(in); };
}

Residual BlockImpl::body(const Residual& in) {
  auto s = norm1_->add_forward(in.x, in.delta);
  auto h = norm2_->add_forward(s.sum, attn_->forward(s.y));
  return {h.sum, mlp_->forward(h.y)};
}

Residual BlockImpl::forward(const Residual& in) {
  if (recompute_ && in.x.requires_grad()) {
    // The pending add happens outside, so the block keeps one tensor (the stream), not two: its
    // first norm is then a plain one.
    auto out = RecomputeBlock::apply(in.sum(), &body_fn_);
    return {out[0], out[1]};
  }
  return body(in);
}

TransformerImpl::TransformerImpl(const TransformerConfig& cfg, TensorParallel tp, PipelineStage stage, bool initialize)
    : cfg_(cfg), tp_(tp), stage_(stage) {
  cfg_.validate("model", tp.size(), tp.sequence_parallel);
  ME_CHECK(stage_.count >= 1 && stage_.index >= 0 && stage_.index < stage_.count, "pipeline stage ", stage_.index,
           " of ", stage_.count, " does not exist");
  const int64_t vocab = cfg_.padded_vocab(tp.size());
  if (stage_.first() || (stage_.last() && cfg_.tie_embeddings))
    embedding_ = register_module("embedding", parallel::VocabParallelEmbedding(vocab, cfg_.hidden, tp));
  if (stage_.first() && cfg_.position == "learned")
    position_ = register_module("position", torch::nn::Embedding(cfg_.seq, cfg_.hidden));
  std::shared_ptr<parallel::Rotary> rope;
  if (cfg_.position == "rope") rope = std::make_shared<parallel::Rotary>(cfg_.head_dim(), cfg_.seq, cfg_.rope_base);
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  const auto [first_layer, layers] = stage_.layer_range(cfg_.layers);
  first_layer_ = first_layer;
  for (int64_t i = first_layer_; i < first_layer_ + layers; ++i) {
    const bool recompute = cfg_.recompute == "full" && i % cfg_.recompute_every == 0;
    blocks_->push_back(Block(cfg_, tp, rope, recompute));
  }
  if (stage_.last()) {
    final_norm_ = register_module("final_norm", parallel::Norm(cfg_.norm, cfg_.hidden, cfg_.norm_eps));
    if (!cfg_.tie_embeddings)
      output_ = register_module("output", parallel::ColumnParallelLinear(cfg_.hidden, vocab, false, tp));
  }

  // Shard map: parallel layers say how they are cut; everything else is replicated, and
  // under sequence parallelism the replicated weights of norms and row biases see only
  // this rank's positions.
  for (const auto& m : named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    std::vector<std::pair<std::string, parallel::ShardInfo>> s;
    if (auto* c = m.value()->as<parallel::ColumnParallelLinearImpl>()) s = c->shards();
    if (auto* r = m.value()->as<parallel::RowParallelLinearImpl>()) s = r->shards();
    if (auto* e = m.value()->as<parallel::VocabParallelEmbeddingImpl>()) s = e->shards();
    for (auto& [name, info] : s) shards_[m.key().empty() ? name : m.key() + "." + name] = info;
  }
  for (const auto& p : named_parameters()) {
    if (shards_.count(p.key())) continue;
    const bool norm = p.key().find("norm") != std::string::npos;
    shards_[p.key()] = {p.value().sizes().vec(), -1, norm && tp.sequence_parallel && tp.active()};
  }
  if (initialize) reset_parameters(0);
}

void TransformerImpl::reset_parameters(uint64_t seed) {
  const double out_std = cfg_.init_std / std::sqrt(2.0 * static_cast<double>(cfg_.layers));
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    const auto& info = shards_.at(name);
    torch::Tensor full;
    if (ends_with(name, "bias")) {
      full = torch::zeros(info.full_shape);
    } else if (name.find("norm") != std::string::npos) {
      full = torch::ones(info.full_shape);
    } else {
      const bool residual_out = ends_with(name, "proj.weight") || ends_with(name, "fc2.weight") || ends_with(name, "down.weight");
      const double std = residual_out ? out_std : cfg_.init_std;
      auto& value = p.value();
      if ((info.dim < 0 || tp_.size() == 1) && value.device().is_cpu() && value.scalar_type() == torch::kFloat &&
          value.is_contiguous()) {
        seeded_normal_(value, std, mix(seed, global_name(name)));  // whole and fp32 here: drawn in place
        continue;
      }
      full = torch::empty(info.full_shape);
      seeded_normal_(full, std, mix(seed, global_name(name)));
    }
    auto local = info.dim < 0 ? full : parallel::slice_dim(full, info.dim, tp_.rank(), tp_.size());
    p.value().copy_(local);
  }
}

std::string TransformerImpl::global_name(const std::string& local) const {
  const std::string prefix = "blocks.";
  if (first_layer_ == 0 || local.rfind(prefix, 0) != 0) return local;
  const size_t dot = local.find('.', prefix.size());
  const int64_t i = std::stoll(local.substr(prefix.size(), dot - prefix.size()));
  return prefix + std::to_string(i + first_layer_) + local.substr(dot);
}

std::vector<parallel::StateTensor> TransformerImpl::state_tensors(int tp_rank) const {
  std::vector<parallel::StateTensor> out;
  for (const auto& p : named_parameters()) {
    const auto& info = shards_.at(p.key());
    const std::string global = global_name(p.key());
    parallel::StateTensor t;
    t.name = "model." + global;
    t.tensor = p.value();
    t.global_shape = info.full_shape;
    t.dim = info.dim;
    t.length = info.dim >= 0 ? p.value().size(info.dim) : 0;
    t.start = info.dim >= 0 ? tp_rank * t.length : 0;
    t.flat_length = p.value().numel();
    // The word embedding and the untied output layer hold the padded vocabulary along dim 0.
    t.padded_vocab = global == "embedding.weight" || global == "output.weight";
    const bool tied_copy = holds_shared_embedding() && p.key() == "embedding.weight" && !stage_.first();
    t.save = (info.dim >= 0 || tp_rank == 0) && !tied_copy;
    out.push_back(std::move(t));
  }
  return out;
}

bool TransformerImpl::holds_shared_embedding() const {
  return cfg_.tie_embeddings && !stage_.whole() && (stage_.first() || stage_.last());
}

torch::Tensor TransformerImpl::embed(const torch::Tensor& tokens) {
  ME_CHECK(tokens.dim() == 2, "the model expects tokens of shape [batch, seq], got ", tokens.sizes());
  const auto s = tokens.size(1);
  ME_CHECK(s <= cfg_.seq, "a sequence of ", s, " tokens is longer than model.seq = ", cfg_.seq);
  auto x = embedding_->forward(tokens);  // [b, s / tp, h] under sequence parallelism
  if (position_) {
    auto pos = position_->forward(torch::arange(s, torch::TensorOptions().dtype(torch::kLong).device(tokens.device())));
    pos = pos.unsqueeze(0);
    // Under sequence parallelism this rank holds a chunk of the batch's tokens: their positions.
    if (tp_.sequence_parallel) pos = parallel::scatter_seq(pos.expand({tokens.size(0), s, pos.size(2)}), tp_);
    x = x + pos;
  }
  return x;
}

torch::Tensor TransformerImpl::forward_stage(const torch::Tensor& input) {
  auto use = [&](torch::nn::Module& m) {
    if (before_use_) before_use_(m);
  };
  if (stage_.first()) {
    use(*embedding_);
    if (position_) use(*position_);
  }
  Residual r{stage_.first() ? embed(input) : input, {}};
  for (size_t i = 0; i < blocks_->size(); ++i) {
    auto& block = *(*blocks_)[i]->as<BlockImpl>();
    use(block);
    r = graphs_ ? graphs_->forward(i, block, r) : block.forward(r);
  }
  if (!stage_.last()) return r.sum();  // the next stage receives the stream itself
  use(*final_norm_);
  if (output_) use(*output_);
  else use(*embedding_);  // tied head (on a last stage that is not the first)
  auto x = final_norm_->add_forward(r.x, r.delta).y;
  // Tied: the output layer is the word embedding, column-parallel over the vocabulary.
  return output_ ? output_->forward(x) : embedding_->logits(x, /*lookup_follows=*/stage_.first());
}

torch::Tensor TransformerImpl::stage_loss(const torch::Tensor& input, const torch::Tensor& labels) {
  ME_CHECK(stage_.last(), "stage_loss: pipeline stage ", stage_.index, " of ", stage_.count,
           " is not the last one; only the last stage has the output layer");
  return parallel::vocab_parallel_cross_entropy(forward_stage(input), labels, tp_, -100, cfg_.vocab);
}

torch::Tensor TransformerImpl::forward(const torch::Tensor& tokens) {
  ME_CHECK(stage_.whole(), "this model is pipeline stage ", stage_.index + 1, " of ", stage_.count,
           " (layers ", first_layer_, "..", last_layer(),
           "): forward, loss and sampling need the whole model (parallel.pp = 1)");
  return forward_stage(tokens);
}

torch::Tensor TransformerImpl::full_logits(const torch::Tensor& tokens) { return parallel::gather_last(forward(tokens), tp_); }

torch::Tensor TransformerImpl::loss(const torch::Tensor& tokens, const torch::Tensor& labels) {
  return parallel::vocab_parallel_cross_entropy(forward(tokens), labels, tp_, -100, cfg_.vocab);
}

int64_t TransformerImpl::local_parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

void TransformerImpl::finalize_sequence_parallel_grads() {
  if (!tp_.active() || !tp_.sequence_parallel) return;
  for (auto& p : named_parameters()) {
    if (!shards_.at(p.key()).sequence_parallel_grad || !p.value().grad().defined()) continue;
    auto& g = p.value().mutable_grad();
    tp_.group->all_reduce(g, comm::ReduceOp::sum);
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
  os << std::string(static_cast<size_t>(2 * depth), ' ') << (name.empty() ? "" : name + ": ") << m.name();
  for (const auto& p : m.named_parameters(/*recurse=*/false)) os << "  " << p.key() << " " << shape_string(p.value());
  os << "  (" << with_commas(count(m)) << ")\n";
  const auto children = m.named_children();
  // Identical layers (48 of them...) print once, with their multiplicity.
  for (size_t i = 0; i < children.size();) {
    size_t j = i + 1;
    while (j < children.size() && children[j].value()->name() == children[i].value()->name() &&
           count(*children[j].value()) == count(*children[i].value()))
      ++j;
    const std::string label =
        j - i > 1 ? cat(children[i].key(), "..", children[j - 1].key(), " (", j - i, "x)") : children[i].key();
    describe_into(os, label, *children[i].value(), depth + 1);
    i = j;
  }
}

}  // namespace

std::string describe_model(const TransformerImpl& model) {
  std::ostringstream os;
  const auto& tp = model.tensor_parallel();
  os << model.config().describe() << ", tp " << tp.size() << (tp.sequence_parallel ? " with sequence parallelism" : "");
  if (const auto& st = model.stage(); !st.whole())
    os << ", pipeline stage " << st.index + 1 << " of " << st.count << " (layers " << model.first_layer() << ".."
       << model.last_layer() << ")";
  os << "\n";
  describe_into(os, "", model, 0);
  os << "parameters: " << with_commas(model.config().parameter_count(tp.size())) << " in the model, "
     << with_commas(model.local_parameter_count()) << " on this rank (shapes above are this rank's)";
  return os.str();
}

std::vector<int64_t> generate(Transformer& model, std::vector<int64_t> tokens, int64_t count, int64_t top_k,
                              double temperature, uint64_t seed) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  auto last_logits = [&](const torch::Tensor& input) {
    const auto padded = pad_for_sequence_parallel(input, model->tensor_parallel());
    return model->full_logits(padded).select(1, input.size(1) - 1).squeeze(0);
  };
  const auto device = model->parameters().front().device();
  auto out = generate(last_logits, model->config(), device, std::move(tokens), count, top_k, temperature, seed);
  if (was_training) model->train();
  return out;
}

torch::Tensor pad_for_sequence_parallel(const torch::Tensor& tokens, const TensorParallel& tp) {
  if (!tp.active() || !tp.sequence_parallel || tokens.size(1) % tp.size() == 0) return tokens;
  const int64_t pad = tp.size() - tokens.size(1) % tp.size();
  return torch::cat({tokens, torch::zeros({tokens.size(0), pad}, tokens.options())}, 1);
}

std::vector<int64_t> generate(const LastLogits& last_logits, const TransformerConfig& config, torch::Device device,
                              std::vector<int64_t> tokens, int64_t count, int64_t top_k, double temperature,
                              uint64_t seed) {
  ME_CHECK(!tokens.empty(), "generate: the prompt must hold at least one token");
  ME_CHECK(top_k >= 1, "generate: top_k must be >= 1, got ", top_k);
  ME_CHECK(temperature > 0, "generate: temperature must be > 0, got ", temperature);
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  const int64_t ctx = config.seq, vocab = config.vocab;
  for (int64_t i = 0; i < count; ++i) {
    const size_t start = tokens.size() > static_cast<size_t>(ctx) ? tokens.size() - static_cast<size_t>(ctx) : 0;
    std::vector<int64_t> window(tokens.begin() + static_cast<std::ptrdiff_t>(start), tokens.end());
    auto input = torch::tensor(window, torch::kLong).view({1, -1}).to(device);
    // Padded vocabulary entries are not tokens: sample among the real ones only.
    auto logits = last_logits(input).narrow(0, 0, vocab);
    logits = logits.to(torch::kCPU, torch::kFloat) / temperature;
    auto top = logits.topk(std::min<int64_t>(top_k, vocab));
    auto probs = torch::softmax(std::get<0>(top), -1);
    const int64_t pick = torch::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
    tokens.push_back(std::get<1>(top)[pick].item<int64_t>());
  }
  return tokens;
}

}  // namespace me::model
