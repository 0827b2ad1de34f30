#include "engine/optim/master_optimizer.h"

#include <chrono>
#include <cmath>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/torch_compat.h"

namespace me::optim {

namespace {
// Gradients as fp32 for LibTorch's AdamW kernels: the buffer's own tensors, or copies of bf16
// ones (parallel.grad_reduce_dtype = "bf16"; the engine's fused kernel reads bf16 directly).
std::vector<torch::Tensor> as_fp32(const std::vector<torch::Tensor>& grads) {
  std::vector<torch::Tensor> out;
  for (const auto& g : grads) out.push_back(g.scalar_type() == torch::kFloat ? g : g.to(torch::kFloat));
  return out;
}
}  // namespace

MasterOptimizer::MasterOptimizer(std::vector<MasterParam> params, const torch::Tensor& flat_grads,
                                 parallel::FlatLayout layout, OptimizerConfig cfg, comm::ProcessGroup* model_parallel,
                                 comm::ProcessGroup* dp, const torch::Tensor& flat_params)
    : params_(std::move(params)), flat_grads_(flat_grads), flat_params_(flat_params), layout_(std::move(layout)),
      cfg_(cfg), model_parallel_(model_parallel && model_parallel->size() > 1 ? model_parallel : nullptr),
      dp_(dp && dp->size() > 1 ? dp : nullptr) {
  cfg_.options.check();
  ME_CHECK(layout_.offsets.size() == params_.size() && layout_.numel == flat_grads_.numel(),
           "optimizer: the flat layout does not match the parameters and the gradient buffer");
  const bool shard = sharded();
  ME_CHECK(!shard || (flat_params_.defined() && flat_params_.numel() == layout_.numel),
           "the distributed optimizer needs the parameters in a flat buffer laid out like the gradients");
  shard_ = shard ? layout_.shard(dp_->rank(), dp_->size()) : layout_.buckets;
  for (size_t i = 0; i < params_.size(); ++i)
    bucket_of_[params_[i].param.unsafeGetTensorImpl()] = layout_.bucket_at(layout_.offsets[i]);

  torch::NoGradGuard no_grad;
  int64_t total = 0;
  for (const auto& mp : params_) total += mp.param.numel();
  // One segment per piece of a parameter inside one of this rank's ranges (the whole parameter
  // when nothing is sharded).
  for (const auto& r : shard_)
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& p = params_[i].param;
      const auto part = parallel::FlatRange{layout_.offsets[i], p.numel()}.within(r);
      if (part.length == 0) continue;
      Segment s{i, part.start - layout_.offsets[i], part.length, {}, {}, {}, {}};
      auto model = p.detach().reshape({-1}).narrow(0, s.start, s.length);
      // fp32 training: the parameter is its own master; bf16/fp16: an fp32 copy.
      s.master = p.scalar_type() == torch::kFloat ? model : model.to(torch::kFloat);
      s.grad = flat_grads_.narrow(0, part.start, s.length);
      s.m = torch::zeros_like(s.master);
      if (cfg_.options.kind == "adamw") s.v = torch::zeros_like(s.master);
      segments_.push_back(std::move(s));
    }
  const int64_t per_elem = cfg_.options.kind == "adamw" ? 8 : 4;  // moments
  const bool own_masters = !params_.empty() && params_.front().param.scalar_type() != torch::kFloat;
  int64_t held = 0;
  for (const auto& s : segments_) held += s.length;
  state_bytes_ = held * (per_elem + (own_masters ? 4 : 0));
  unsharded_bytes_ = total * (per_elem + (own_masters ? 4 : 0));
}

void MasterOptimizer::make_fused() {
  if (fused_ || cfg_.options.kind != "adamw" || !kernels::use(kernels::Op::adamw, flat_grads_)) return;
  std::vector<kernels::MultiTensorAdamW::Entry> entries;
  fused_writes_model_ = true;
  for (auto& s : segments_) {
    const auto& p = params_[s.param].param;
    kernels::MultiTensorAdamW::Entry e{s.master, s.grad, s.m, s.v, {},
                                       params_[s.param].decay ? cfg_.options.weight_decay : 0.0,
                                       params_[s.param].count_in_norm};
    if (p.scalar_type() == torch::kBFloat16) e.model = p.detach().view({-1}).narrow(0, s.start, s.length);
    else if (p.scalar_type() != torch::kFloat) fused_writes_model_ = false;  // fp16: LibTorch's copy
    entries.push_back(std::move(e));
  }
  fused_ = std::make_unique<kernels::MultiTensorAdamW>(entries);
}

double MasterOptimizer::global_norm() {
  // Sum of squares over this rank's gradients, counting TP-replicated parameters once, then
  // summed over the ranks that hold different pieces: the model-parallel group (TP ranks and
  // pipeline stages) always, DP when grads are sharded.
  // Accumulated in fp64 (read as fp32, no copy): an fp32 sum over millions of elements is only
  // good to ~1e-6, so the same gradients split differently over ranks would clip differently.
  torch::Tensor sq;
  if (fused_) {
    sq = fused_->grad_sum_squares();
  } else {
    sq = torch::zeros({1}, flat_grads_.options().dtype(torch::kDouble));
    for (const auto& s : segments_)
      if (params_[s.param].count_in_norm)
        sq += at::linalg_vector_norm(s.grad, 2, c10::nullopt, false, torch::kDouble).square();
  }
  if (model_parallel_) model_parallel_->all_reduce(sq, comm::ReduceOp::sum);
  if (sharded()) dp_->all_reduce(sq, comm::ReduceOp::sum);
  const auto t0 = std::chrono::steady_clock::now();
  const double total = sq.item<double>();
  norm_wait_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return std::sqrt(total);
}

double MasterOptimizer::take_norm_wait_ms() { return std::exchange(norm_wait_ms_, 0.0); }

void MasterOptimizer::update(double lr, double clip) {
  ++steps_;
  if (cfg_.options.kind == "sgd") {  // SGD with momentum; weight decay added to the gradient
    for (auto& s : segments_) {
      const double wd = params_[s.param].decay ? cfg_.options.weight_decay : 0.0;
      auto g = s.grad.to(torch::kFloat) * clip;
      if (wd != 0.0) g.add_(s.master, wd);
      s.m.mul_(cfg_.options.momentum).add_(g);
      s.master.add_(s.m, -lr);
    }
    return;
  }
  if (fused_) {  // engine/kernels: every tensor in one launch, clipping and write-back included
    fused_->step(lr, cfg_.options.betas[0], cfg_.options.betas[1], cfg_.options.eps, steps_, clip);
    return;
  }
  // AdamW: on a GPU one fused kernel per weight-decay class, with the clipping folded in as a
  // divisor of the gradients; elsewhere multi-tensor kernels.
  if (!step_count_.defined()) {
    step_count_ = torch::zeros({}, flat_grads_.options().dtype(torch::kFloat));
    grad_divisor_ = torch::ones({}, flat_grads_.options().dtype(torch::kFloat));
  }
  step_count_.fill_(static_cast<double>(steps_));
  grad_divisor_.fill_(1.0 / clip);
  for (const bool decay : {true, false}) {
    std::vector<torch::Tensor> p, g, m, v;
    for (auto& s : segments_) {
      if (params_[s.param].decay != decay) continue;
      p.push_back(s.master);
      g.push_back(s.grad);
      m.push_back(s.m);
      v.push_back(s.v);
    }
    if (p.empty()) continue;  // a distributed-optimizer shard may hold no tensor of this class
    const double wd = decay ? cfg_.options.weight_decay : 0.0;
    auto g32 = as_fp32(g);  // widened once; the fallback clips these fp32 tensors in place
    if (compat::fused_adamw(p, g32, m, v, step_count_, lr, cfg_.options.betas[0], cfg_.options.betas[1], wd, cfg_.options.eps,
                            grad_divisor_))
      continue;
    if (clip != 1.0) at::_foreach_mul_(g32, clip);
    adamw_update(p, g32, m, v, lr, wd, cfg_.options, steps_);
  }
}

void MasterOptimizer::write_back() {
  if (!(fused_ && fused_writes_model_))
    for (auto& s : segments_) {
      auto& p = params_[s.param].param;
      if (p.scalar_type() != torch::kFloat) p.detach().view({-1}).narrow(0, s.start, s.length).copy_(s.master);
    }
  if (!sharded()) return;
  // Every rank updated its piece of each bucket (inside the flat parameter buffer the model's
  // parameters are views of): gather the pieces in place, bucket by bucket, in the order the
  // forward uses them (the last bucket holds the first layers).
  gathers_.assign(layout_.buckets.size(), nullptr);
  auto gather_all = [&] {
    for (size_t k = layout_.buckets.size(); k-- > 0;) {
      const auto& b = layout_.buckets[k];
      const auto mine = layout_.piece(k, dp_->rank(), dp_->size());
      auto bucket = flat_params_.narrow(0, b.start, b.length);
      auto piece = flat_params_.narrow(0, mine.start, mine.length);
      gathers_[k] = dp_->all_gather(bucket, piece, /*async=*/true);
    }
  };
  if (cfg_.overlap_param_gather) {
    // On the GPU on a side stream, after the update; the next forward waits per bucket.
    gather_stream_.run(flat_params_.device(), gather_all);
    return;
  }
  gather_all();
  wait_params();
}

void MasterOptimizer::wait_for(const torch::Tensor& param) {
  if (gathers_.empty()) return;
  const auto it = bucket_of_.find(param.unsafeGetTensorImpl());
  if (it == bucket_of_.end() || !gathers_[it->second]) return;
  gathers_[it->second]->wait();
  gathers_[it->second].reset();
}

void MasterOptimizer::wait_params() {
  for (auto& w : gathers_)
    if (w) w->wait();
  gathers_.clear();
}

std::vector<parallel::StateTensor> MasterOptimizer::state_tensors(const std::vector<parallel::StateTensor>& params) const {
  const bool adamw = cfg_.options.kind == "adamw";
  const bool dp_first = dp_ == nullptr || dp_->rank() == 0;
  std::vector<parallel::StateTensor> out;
  for (const auto& s : segments_) {
    auto base = params.at(s.param);
    ME_CHECK(base.name.rfind("model.", 0) == 0, "optimizer state: parameter piece '", base.name, "' is not named model.*");
    const std::string global = base.name.substr(6);
    base.flat_start = s.start;
    base.flat_length = s.length;
    base.save = params_[s.param].count_in_norm && (sharded() || dp_first);
    auto add = [&](const char* kind, const torch::Tensor& tensor) {
      auto t = base;
      t.name = std::string(kind) + "." + global;
      t.tensor = tensor;
      out.push_back(std::move(t));
    };
    if (params_[s.param].param.scalar_type() != torch::kFloat) add("master", s.master);
    add(adamw ? "exp_avg" : "momentum", s.m);
    if (adamw) add("exp_avg_sq", s.v);
  }
  return out;
}

double MasterOptimizer::step(double lr) {
  torch::NoGradGuard no_grad;
  wait_params();  // a forward waited for them already, unless none ran since the last step
  make_fused();
  const double norm = global_norm();
  if (!std::isfinite(norm)) return norm;  // every rank sees the same norm: all skip together
  update(lr, cfg_.options.clip > 0 && norm > cfg_.options.clip ? cfg_.options.clip / (norm + 1e-6) : 1.0);
  write_back();
  return norm;
}

}  // namespace me::optim
