#include "engine/comm/gloo_group.h"

#include "engine/core/error.h"

#if ME_HAVE_GLOO
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

namespace me::comm {

#if ME_HAVE_GLOO
namespace {

class GlooWork : public Work {
 public:
  explicit GlooWork(c10::intrusive_ptr<c10d::Work> w, std::function<void()> then = {})
      : work_(std::move(w)), then_(std::move(then)) {}
  void wait() override {
    work_->wait();  // gloo enforces the group timeout itself and throws past it
    if (then_) {
      then_();
      then_ = nullptr;
    }
  }
  bool is_completed() override { return work_->isCompleted(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> then_;  // post-processing on completion (avg's division)
};

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::max: return c10d::ReduceOp::MAX;
    case ReduceOp::min: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;  // avg = sum, then divide: gloo has no AVG
  }
}

class GlooGroup : public ProcessGroup {
 public:
  GlooGroup(std::string name, std::vector<int> ranks, int global_rank, const c10::intrusive_ptr<c10d::Store>& store,
            std::chrono::milliseconds timeout, const std::string& host)
      : ProcessGroup(std::move(name), std::move(ranks), global_rank) {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("me/pg/" + this->name(), store);
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank(), size(), opts);
  }
  std::string backend() const override { return "gloo"; }

 protected:
  // Gloo (LibTorch 1.13) has no bfloat16/half kernels: such tensors travel as float32 and
  // are copied back on completion. Exact for max/min/broadcast/send; sums round once.
  static bool upcast(const torch::Tensor& t) {
    return t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf;
  }
  static torch::Tensor wire(const torch::Tensor& t) { return upcast(t) ? t.to(torch::kFloat) : t; }

  WorkPtr do_all_reduce(torch::Tensor& t, ReduceOp op) override {
    auto buf = wire(t);
    std::vector<at::Tensor> v{buf};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    auto w = pg_->allreduce(v, o);
    const int n = size();
    const bool avg = op == ReduceOp::avg, copy = upcast(t);
    if (!avg && !copy) return std::make_shared<GlooWork>(w);
    return std::make_shared<GlooWork>(w, [t, buf, n, avg, copy]() mutable {
      if (avg) buf.div_(n);
      if (copy) t.copy_(buf);
    });
  }
  WorkPtr do_all_gather(torch::Tensor& out, const torch::Tensor& in) override {
    auto out_buf = wire(out);
    std::vector<std::vector<at::Tensor>> outs{out_buf.view({-1}).chunk(size())};
    std::vector<at::Tensor> ins{wire(in).view({-1})};
    auto w = pg_->allgather(outs, ins);
    if (!upcast(out)) return std::make_shared<GlooWork>(w);
    return std::make_shared<GlooWork>(w, [out, out_buf]() mutable { out.copy_(out_buf); });
  }
  WorkPtr do_reduce_scatter(torch::Tensor& out, const torch::Tensor& in, ReduceOp op) override {
    // Gloo in LibTorch 1.13 has no reduce_scatter: all-reduce a copy, keep this rank's chunk.
    // Same result, size() times the traffic; the GPU path (NCCL) has the real one.
    auto full = wire(in).clone();
    std::vector<at::Tensor> v{full};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    pg_->allreduce(v, o)->wait();
    auto mine = full.view({-1}).chunk(size())[static_cast<size_t>(rank())];
    if (op == ReduceOp::avg) mine.div_(size());
    out.view({-1}).copy_(mine);
    return std::make_shared<CompletedWork>();
  }
  WorkPtr do_broadcast(torch::Tensor& t, int root) override {
    auto buf = wire(t);
    std::vector<at::Tensor> v{buf};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    auto w = pg_->broadcast(v, o);
    if (!upcast(t)) return std::make_shared<GlooWork>(w);
    return std::make_shared<GlooWork>(w, [t, buf]() mutable { t.copy_(buf); });
  }
  WorkPtr do_send(const torch::Tensor& t, int dst) override {
    std::vector<at::Tensor> v{wire(t)};
    return std::make_shared<GlooWork>(pg_->send(v, dst, /*tag=*/0));
  }
  WorkPtr do_recv(torch::Tensor& t, int src) override {
    auto buf = wire(t);
    std::vector<at::Tensor> v{buf};
    auto w = pg_->recv(v, src, /*tag=*/0);
    if (!upcast(t)) return std::make_shared<GlooWork>(w);
    return std::make_shared<GlooWork>(w, [t, buf]() mutable { t.copy_(buf); });
  }
  WorkPtr do_barrier() override { return std::make_shared<GlooWork>(pg_->barrier()); }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

}  // namespace

bool gloo_available() { return true; }

std::unique_ptr<ProcessGroup> make_gloo_group(std::string name, std::vector<int> global_ranks, int global_rank,
                                              const c10::intrusive_ptr<c10d::Store>& store,
                                              std::chrono::milliseconds timeout, const std::string& host) {
  return std::make_unique<GlooGroup>(std::move(name), std::move(global_ranks), global_rank, store, timeout, host);
}

#else

bool gloo_available() { return false; }

std::unique_ptr<ProcessGroup> make_gloo_group(std::string name, std::vector<int>, int,
                                              const c10::intrusive_ptr<c10d::Store>&, std::chrono::milliseconds,
                                              const std::string&) {
  fail("group '", name, "': CPU collectives need Gloo, which this LibTorch build lacks; use device=cuda (NCCL)");
}

#endif

}  // namespace me::comm
