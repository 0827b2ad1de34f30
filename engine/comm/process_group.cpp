#include "engine/comm/process_group.h"

#include <algorithm>
#include <chrono>

#include "engine/core/error.h"

namespace me::comm {

ReduceOp parse_reduce_op(const std::string& name) {
  if (name == "sum") return ReduceOp::sum;
  if (name == "avg" || name == "mean") return ReduceOp::avg;
  if (name == "max") return ReduceOp::max;
  if (name == "min") return ReduceOp::min;
  fail("unknown reduce op '", name, "': expected sum, avg, max or min");
}

std::string reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

ProcessGroup::ProcessGroup(std::string name, std::vector<int> global_ranks, int global_rank)
    : name_(std::move(name)), ranks_(std::move(global_ranks)) {
  auto it = std::find(ranks_.begin(), ranks_.end(), global_rank);
  ME_CHECK(it != ranks_.end(), "rank ", global_rank, " is not a member of group '", name_, "'");
  rank_ = static_cast<int>(it - ranks_.begin());
}

torch::Tensor ProcessGroup::empty_symmetric(int64_t numel, const torch::TensorOptions& options) {
  return torch::zeros({numel}, options);
}

namespace {

thread_local int64_t t_waited_ns = 0;  // see waited_ns()

// Turns a backend failure into one message naming the group, the collective and, through
// the diagnosis, the ranks that are missing.
class DiagnosedWork : public Work {
 public:
  DiagnosedWork(WorkPtr inner, std::function<std::string(const std::string&)> explain)
      : inner_(std::move(inner)), explain_(std::move(explain)) {}
  void wait() override {
    std::string failure;
    const auto t0 = std::chrono::steady_clock::now();
    struct Count {  // however wait() is left
      std::chrono::steady_clock::time_point t0;
      ~Count() { t_waited_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count(); }
    } count{t0};
    try {
      inner_->wait();
      return;
    } catch (const std::exception& e) {
      failure = e.what();
    }
    throw Error(explain_(failure));
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  WorkPtr inner_;
  std::function<std::string(const std::string&)> explain_;
};

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

void check_dense(const torch::Tensor& t, const char* what, const std::string& group) {
  ME_CHECK(t.defined(), what, ": tensor is undefined (group '", group, "')");
  ME_CHECK(t.is_contiguous(), what, ": tensor must be contiguous (call :clone() or .contiguous() first)");
}

}  // namespace

int64_t waited_ns() { return t_waited_ns; }

WorkPtr ProcessGroup::run(const char* op, bool async, const std::function<WorkPtr()>& start) {
  const int64_t seq = ++seq_;
  last_op_.store(op);
  last_started_.store(std::chrono::steady_clock::now().time_since_epoch().count());
  auto explain = [this, op, seq](const std::string& failure) {
    std::string msg = cat(op, " on group '", name_, "' (", backend(), ", collective #", seq, ") failed: ",
                          first_line(failure));
    if (diagnose_) msg += diagnose_(*this, seq);
    return msg;
  };
  WorkPtr inner;
  std::string failure;
  try {
    inner = start();
  } catch (const Error&) {
    throw;  // our own argument errors need no diagnosis
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!inner) throw Error(explain(failure));
  auto work = std::make_shared<DiagnosedWork>(std::move(inner), explain);
  if (!async) work->wait();
  return work;
}

WorkPtr ProcessGroup::all_reduce(torch::Tensor& t, ReduceOp op, bool async) {
  check_dense(t, "all_reduce", name_);
  ME_CHECK(op != ReduceOp::avg || t.is_floating_point(), "all_reduce avg needs a floating-point tensor, got ",
           t.scalar_type());
  return run("all_reduce", async, [&] { return do_all_reduce(t, op); });
}

WorkPtr ProcessGroup::all_gather(torch::Tensor& out, const torch::Tensor& in, bool async) {
  check_dense(out, "all_gather output", name_);
  check_dense(in, "all_gather input", name_);
  ME_CHECK(out.numel() == in.numel() * size() && out.scalar_type() == in.scalar_type(), "all_gather: output of ",
           out.numel(), " ", out.scalar_type(), " elements must hold ", size(), " x ", in.numel(), " ",
           in.scalar_type(), " elements");
  return run("all_gather", async, [&] { return do_all_gather(out, in); });
}

WorkPtr ProcessGroup::reduce_scatter(torch::Tensor& out, const torch::Tensor& in, ReduceOp op, bool async) {
  check_dense(out, "reduce_scatter output", name_);
  check_dense(in, "reduce_scatter input", name_);
  ME_CHECK(in.numel() == out.numel() * size() && out.scalar_type() == in.scalar_type(), "reduce_scatter: input of ",
           in.numel(), " elements must hold ", size(), " chunks of the output's ", out.numel());
  ME_CHECK(op != ReduceOp::avg || in.is_floating_point(), "reduce_scatter avg needs a floating-point tensor");
  return run("reduce_scatter", async, [&] { return do_reduce_scatter(out, in, op); });
}

WorkPtr ProcessGroup::broadcast(torch::Tensor& t, int root, bool async) {
  check_dense(t, "broadcast", name_);
  ME_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " is not a rank of group '", name_, "' (size ",
           size(), ")");
  return run("broadcast", async, [&] { return do_broadcast(t, root); });
}

WorkPtr ProcessGroup::send(const torch::Tensor& t, int dst, bool async) {
  check_dense(t, "send", name_);
  ME_CHECK(dst >= 0 && dst < size() && dst != rank_, "send: destination ", dst, " must be another rank of group '",
           name_, "' (size ", size(), ", this rank ", rank_, ")");
  return run("send", async, [&] { return do_send(t, dst); });
}

WorkPtr ProcessGroup::recv(torch::Tensor& t, int src, bool async) {
  check_dense(t, "recv", name_);
  ME_CHECK(src >= 0 && src < size() && src != rank_, "recv: source ", src, " must be another rank of group '", name_,
           "' (size ", size(), ", this rank ", rank_, ")");
  return run("recv", async, [&] { return do_recv(t, src); });
}

WorkPtr ProcessGroup::send_recv(const std::vector<PeerOp>& ops, bool async) {
  for (const auto& op : ops) {
    const bool send = op.kind == PeerOp::send;
    check_dense(op.tensor, send ? "send_recv (a send)" : "send_recv (a receive)", name_);
    ME_CHECK(op.peer >= 0 && op.peer < size() && op.peer != rank_, "send_recv: peer ", op.peer,
             " must be another rank of group '", name_, "' (size ", size(), ", this rank ", rank_, ")");
  }
  return run("send_recv", async, [&] { return do_send_recv(ops); });
}

namespace {
// The Works of a batch's transfers, as one.
class WorkList : public Work {
 public:
  explicit WorkList(std::vector<WorkPtr> works) : works_(std::move(works)) {}
  void wait() override {
    for (auto& w : works_) w->wait();
  }
  bool is_completed() override {
    return std::all_of(works_.begin(), works_.end(), [](const WorkPtr& w) { return w->is_completed(); });
  }

 private:
  std::vector<WorkPtr> works_;
};
}  // namespace

WorkPtr ProcessGroup::do_send_recv(const std::vector<PeerOp>& ops) {
  std::vector<WorkPtr> works;
  for (const auto& op : ops) {
    auto t = op.tensor;
    works.push_back(op.kind == PeerOp::send ? do_send(t, op.peer) : do_recv(t, op.peer));
  }
  return std::make_shared<WorkList>(std::move(works));
}

void ProcessGroup::barrier() { run("barrier", false, [&] { return do_barrier(); }); }

std::string ProcessGroup::describe() const {
  std::string r;
  for (size_t i = 0; i < ranks_.size(); ++i) r += (i ? "," : "") + std::to_string(ranks_[i]);
  return cat("ProcessGroup(", name_, ", ", backend(), ", rank ", rank_, " of ", size(), ", global ranks [", r, "])");
}

}  // namespace me::comm
