// A process group: the collectives of one set of ranks, on one backend (Gloo for CPU tensors,
// NCCL for CUDA tensors). Every call counts as one collective of the group; a failure or a
// timeout is reported with what the other ranks were doing (see Diagnose), so a dead or hung
// rank is named instead of leaving a silent hang.
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace me::comm {

enum class ReduceOp { sum, avg, max, min };
ReduceOp parse_reduce_op(const std::string& name);
std::string reduce_op_name(ReduceOp op);

// A handle on a collective in flight. wait() throws me::Error on failure or timeout.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// Nanoseconds the calling thread has spent blocked in Work::wait (every collective's wait goes
// through it): the training thread's time waiting for the other ranks, which the straggler
// report subtracts from its step time. On NCCL collectives rarely block the host.
int64_t waited_ns();

// A Work that finished before it was returned (synchronous fallbacks).
class CompletedWork : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

// One transfer of a send_recv batch: send `tensor` to, or receive it from, group rank `peer`.
struct PeerOp {
  enum Kind { send, recv } kind;
  torch::Tensor tensor;
  int peer;
};

class ProcessGroup {
 public:
  // Explains a failure of collective #seq of `group` from the other ranks' published progress.
  using Diagnose = std::function<std::string(const ProcessGroup& group, int64_t seq)>;

  ProcessGroup(std::string name, std::vector<int> global_ranks, int global_rank);
  virtual ~ProcessGroup() = default;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }  // this process's rank inside the group
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }  // group rank -> global rank
  int64_t collectives_started() const { return seq_.load(); }
  // The collective this rank started last on this group, for heartbeats: its name (nullptr
  // before the first) and when it started.
  const char* last_op() const { return last_op_.load(); }
  std::chrono::steady_clock::time_point last_started() const {
    return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(last_started_.load()));
  }
  virtual std::string backend() const = 0;
  // Tears the group's communicator down from any thread, so that collectives blocked in it
  // end (NCCL: ncclCommAbort). Only before the process exits: the group is unusable after.
  // Default (Gloo): nothing; the process's exit closes its connections.
  virtual void abort() {}
  void set_diagnose(Diagnose d) { diagnose_ = std::move(d); }

  // Collectives: blocking unless async, in which case the caller waits on the Work. Tensors
  // must be contiguous; all_gather's `out` holds size() copies of `in` back to back along
  // dimension 0, reduce_scatter's `in` holds size() chunks of `out`.
  WorkPtr all_reduce(torch::Tensor& t, ReduceOp op, bool async = false);
  WorkPtr all_gather(torch::Tensor& out, const torch::Tensor& in, bool async = false);
  WorkPtr reduce_scatter(torch::Tensor& out, const torch::Tensor& in, ReduceOp op, bool async = false);
  WorkPtr broadcast(torch::Tensor& t, int root, bool async = false);  // root: a group rank
  WorkPtr send(const torch::Tensor& t, int dst, bool async = false);  // dst: a group rank
  WorkPtr recv(torch::Tensor& t, int src, bool async = false);        // src: a group rank
  // Sends and receives started together, so that no order between them can deadlock (a
  // pipeline stage sends activations forward while receiving gradients back): NCCL runs them
  // as one group, Gloo posts them all before waiting. Counts as one collective.
  WorkPtr send_recv(const std::vector<PeerOp>& ops, bool async = false);
  void barrier();

  // A zeroed buffer of `numel` elements that this group's collectives may reach on every rank
  // directly: NCCL registers it as a symmetric window (ncclMemAlloc + ncclCommWindowRegister), and
  // with comm.nccl_cta_policy = "zero" serves all-gathers into it by the copy engines, leaving the
  // multiprocessors to the compute beside them. Collective: every member calls it with the same
  // size, in the same order. The memory lives as long as the group. Default (Gloo): a plain tensor.
  virtual torch::Tensor empty_symmetric(int64_t numel, const torch::TensorOptions& options);

  std::string describe() const;

 protected:
  virtual WorkPtr do_all_reduce(torch::Tensor& t, ReduceOp op) = 0;
  virtual WorkPtr do_all_gather(torch::Tensor& out, const torch::Tensor& in) = 0;
  virtual WorkPtr do_reduce_scatter(torch::Tensor& out, const torch::Tensor& in, ReduceOp op) = 0;
  virtual WorkPtr do_broadcast(torch::Tensor& t, int root) = 0;
  virtual WorkPtr do_send(const torch::Tensor& t, int dst) = 0;
  virtual WorkPtr do_recv(torch::Tensor& t, int src) = 0;
  virtual WorkPtr do_barrier() = 0;
  // Default: each transfer started on its own (do_send/do_recv must not block), then all waited.
  virtual WorkPtr do_send_recv(const std::vector<PeerOp>& ops);
  // The other ranks' state, for failures a backend detects on its own (NCCL's monitor).
  std::string diagnosis(int64_t seq) const { return diagnose_ ? diagnose_(*this, seq) : ""; }

 private:
  // Counts the collective, runs it, and wraps failures (now or at wait()) with the diagnosis.
  WorkPtr run(const char* op, bool async, const std::function<WorkPtr()>& start);

  std::string name_;
  std::vector<int> ranks_;
  int rank_ = -1;
  std::atomic<int64_t> seq_{0};
  std::atomic<const char*> last_op_{nullptr};
  std::atomic<std::chrono::steady_clock::rep> last_started_{0};
  Diagnose diagnose_;
};

}  // namespace me::comm
