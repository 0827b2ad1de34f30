#include "engine/comm/nccl_group.h"

#include "engine/launch/bootstrap.h"
#include "engine/launch/cpu_affinity.h"
#include "engine/core/graph_capture.h"
#include "engine/core/error.h"
#include "engine/core/format.h"
#include "engine/core/log.h"

#if ME_HAVE_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

// Symmetric windows (ncclMemAlloc'd buffers registered for every rank's direct access): 2.27.
#define ME_NCCL_WINDOWS (NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0))
#endif

namespace me::comm {

#if ME_HAVE_NCCL
namespace {

#define ME_NCCL(expr, what)                                                                       \
  do {                                                                                            \
    ncclResult_t r_ = (expr);                                                                     \
    if (r_ != ncclSuccess) ::me::fail(what, ": ", ncclGetErrorString(r_), " (", #expr, ")");    \
  } while (0)
#define ME_CUDA(expr, what)                                                                       \
  do {                                                                                            \
    cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) ::me::fail(what, ": ", cudaGetErrorString(e_));                       \
  } while (0)

ncclDataType_t to_nccl(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kChar: return ncclInt8;
    case at::kByte: case at::kBool: return ncclUint8;
    default: fail("NCCL cannot reduce tensors of type ", t);
  }
}

// CommOptions::nccl_cta_policy as ncclConfig_t's CTAPolicy; NCCL_CONFIG_UNDEF_INT: NCCL's default.
int cta_policy_value(const std::string& policy) {
  if (policy == "default") return NCCL_CONFIG_UNDEF_INT;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  if (policy == "efficiency") return NCCL_CTA_POLICY_EFFICIENCY;
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
  if (policy == "zero") return NCCL_CTA_POLICY_ZERO;
#endif
  fail("comm.nccl_cta_policy = '", policy, "': expected default, efficiency (NCCL >= 2.27) or zero (NCCL >= 2.28); ",
       "this build has NCCL ", NCCL_MAJOR, ".", NCCL_MINOR);
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

// Completion of one collective: an event recorded on the stream right after it, owned
// jointly by the Work handed to the caller and the group's in-flight list (the monitor
// retires the list's entry when it completes; a caller may still wait on it later).
struct CudaEvent {
  cudaEvent_t event = nullptr;
  CudaEvent() { ME_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"); }
  ~CudaEvent() { cudaEventDestroy(event); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
};

class NcclWork : public Work {
 public:
  explicit NcclWork(std::shared_ptr<CudaEvent> ev) : event_(std::move(ev)) {}
  // Orders the caller's current stream after the collective; the host does not block. A
  // collective that never completes is caught by the group's monitor thread instead.
  void wait() override {
    ME_CUDA(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream().stream(), event_->event, 0), "wait");
  }
  bool is_completed() override { return cudaEventQuery(event_->event) == cudaSuccess; }

 private:
  std::shared_ptr<CudaEvent> event_;
};

class NcclGroup : public ProcessGroup {
 public:
  NcclGroup(std::string name, std::vector<int> ranks, int global_rank, const c10::intrusive_ptr<c10d::Store>& store,
            std::chrono::milliseconds timeout, int device, const std::string& cta_policy)
      : ProcessGroup(std::move(name), std::move(ranks), global_rank), timeout_(timeout), device_(device),
        zero_cta_(cta_policy == "zero") {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    config.CTAPolicy = cta_policy_value(cta_policy);
#else
    ME_CHECK(cta_policy == "default", "comm.nccl_cta_policy needs NCCL >= 2.27; this build has ", NCCL_MAJOR, ".",
             NCCL_MINOR);
#endif
    ncclUniqueId id;
    const std::string key = "me/nccl/" + this->name() + "/id";
    if (rank() == 0) {
      ME_NCCL(ncclGetUniqueId(&id), "ncclGetUniqueId");
      const auto* p = reinterpret_cast<const uint8_t*>(&id);
      store->set(key, std::vector<uint8_t>(p, p + sizeof id));
    } else {
      store->wait({key});
      const auto v = store->get(key);
      ME_CHECK(v.size() == sizeof id, "group '", this->name(), "': malformed NCCL id in the store");
      std::memcpy(&id, v.data(), sizeof id);
    }
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    ME_NCCL(ncclCommInitRankConfig(&comm_, size(), id, rank(), &config), cat("NCCL init of group '", this->name(), "'"));
    monitor_ = std::thread([this] { monitor_loop(); });
  }

  ~NcclGroup() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (monitor_.joinable()) monitor_.join();
    inflight_.clear();
    // Windows go before the communicator, their memory after it (every member destroys its
    // groups in the same order, as deregistration needs).
#if ME_NCCL_WINDOWS
    if (comm_)
      for (auto& w : windows_) ncclCommWindowDeregister(comm_, w.window);
#endif
    if (comm_) ncclCommDestroy(comm_);
#if ME_NCCL_WINDOWS
    for (auto& w : windows_) ncclMemFree(w.ptr);
#endif
    if (own_stream_) cudaStreamDestroy(own_stream_);
  }

  torch::Tensor empty_symmetric(int64_t numel, const torch::TensorOptions& options) override {
#if ME_NCCL_WINDOWS
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    const size_t bytes = std::max<size_t>(
        1, static_cast<size_t>(numel) * c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
    Window w;
    ME_NCCL(ncclMemAlloc(&w.ptr, bytes), cat("group '", name(), "': ncclMemAlloc of ", bytes, " B"));
    ME_CUDA(cudaMemset(w.ptr, 0, bytes), "cudaMemset");
    ME_NCCL(ncclCommWindowRegister(comm_, w.ptr, bytes, &w.window, NCCL_WIN_COLL_SYMMETRIC),
            cat("group '", name(), "': ncclCommWindowRegister of ", bytes, " B"));
    windows_.push_back(w);
    // The group frees the memory when it is destroyed (see ~NcclGroup), not the tensor.
    return torch::from_blob(w.ptr, {numel}, [](void*) {}, options.device(torch::Device(torch::kCUDA, device_)));
#else
    return ProcessGroup::empty_symmetric(numel, options);
#endif
  }

  std::string backend() const override { return "nccl"; }

  // From the communicator's watchdog (a dead rank) or the monitor (a timeout): the GPU work
  // queued on this communicator is cancelled and the process can exit.
  void abort() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 protected:
  WorkPtr do_all_reduce(torch::Tensor& t, ReduceOp op) override {
    return launch("all_reduce", t, [&](cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), to_nccl(t.scalar_type()),
                           to_nccl(op), comm_, s);
    });
  }
  WorkPtr do_all_gather(torch::Tensor& out, const torch::Tensor& in) override {
    return launch("all_gather", in, [&](cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()), to_nccl(in.scalar_type()),
                           comm_, s);
    });
  }
  WorkPtr do_reduce_scatter(torch::Tensor& out, const torch::Tensor& in, ReduceOp op) override {
    return launch("reduce_scatter", in, [&](cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                               to_nccl(in.scalar_type()), to_nccl(op), comm_, s);
    });
  }
  WorkPtr do_broadcast(torch::Tensor& t, int root) override {
    return launch("broadcast", t, [&](cudaStream_t s) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), to_nccl(t.scalar_type()), root,
                           comm_, s);
    });
  }
  WorkPtr do_send(const torch::Tensor& t, int dst) override {
    return launch("send", t, [&](cudaStream_t s) {
      return ncclSend(t.data_ptr(), static_cast<size_t>(t.numel()), to_nccl(t.scalar_type()), dst, comm_, s);
    });
  }
  WorkPtr do_recv(torch::Tensor& t, int src) override {
    return launch("recv", t, [&](cudaStream_t s) {
      return ncclRecv(t.data_ptr(), static_cast<size_t>(t.numel()), to_nccl(t.scalar_type()), src, comm_, s);
    });
  }
  WorkPtr do_send_recv(const std::vector<PeerOp>& ops) override {
    ME_CHECK(!ops.empty(), "send_recv on group '", name(), "': no transfers");
    return launch("send_recv", ops.front().tensor, [&](cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      for (const auto& op : ops) {
        if (r != ncclSuccess) break;
        const auto n = static_cast<size_t>(op.tensor.numel());
        const auto type = to_nccl(op.tensor.scalar_type());
        r = op.kind == PeerOp::send ? ncclSend(op.tensor.data_ptr(), n, type, op.peer, comm_, s)
                                    : ncclRecv(op.tensor.data_ptr(), n, type, op.peer, comm_, s);
      }
      const ncclResult_t end = ncclGroupEnd();  // always closes the group it opened
      return r != ncclSuccess ? r : end;
    });
  }
  WorkPtr do_barrier() override {
    // A barrier is a host-side promise: all-reduce one number, then wait for it here.
    auto one = torch::ones({1}, torch::TensorOptions().device(torch::kCUDA, device_));
    auto w = do_all_reduce(one, ReduceOp::sum);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (!w->is_completed()) {
      ME_CHECK(std::chrono::steady_clock::now() < deadline, "barrier timed out after ",
               human::seconds(timeout_.count() / 1000.0));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return w;
  }

 private:
  struct InFlight {
    std::shared_ptr<CudaEvent> event;
    int64_t seq;
    const char* op;
    std::chrono::steady_clock::time_point started;
  };

  template <typename F>
  WorkPtr launch(const char* op, const torch::Tensor& t, F&& call) {
    ME_CHECK(t.is_cuda() && t.device().index() == device_, op, " on group '", name(), "': tensor is on ", t.device(),
             ", the group drives cuda:", device_);
    // Its event and watchdog are the host's: a captured collective would be watched once, not per replay.
    ME_CHECK(!graph_capture_underway(), op, " on group '", name(), "' inside a CUDA graph capture (train.cuda_graphs): ",
             "NCCL's collectives are not captured; set train.cuda_graphs = false");
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    const cudaStream_t current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
    cudaStream_t stream = current;
    // NCCL 2.28's copy-engine collectives (the zero-CTA policy, into windows) fail with a CUDA
    // error on the legacy default stream: there the collective runs on the group's own stream,
    // after what the default stream queued, and the default stream waits for it.
    if (zero_cta_ && (current == nullptr || current == cudaStreamLegacy)) {
      if (!own_stream_) ME_CUDA(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      CudaEvent queued;
      ME_CUDA(cudaEventRecord(queued.event, current), "cudaEventRecord");
      ME_CUDA(cudaStreamWaitEvent(own_stream_, queued.event, 0), "cudaStreamWaitEvent");
      stream = own_stream_;
    }
    ME_NCCL(call(stream), cat(op, " on group '", name(), "'"));
    auto ev = std::make_shared<CudaEvent>();
    ME_CUDA(cudaEventRecord(ev->event, stream), "cudaEventRecord");
    if (stream != current) ME_CUDA(cudaStreamWaitEvent(current, ev->event, 0), "cudaStreamWaitEvent");
    std::lock_guard<std::mutex> lock(mutex_);
    inflight_.push_back({ev, collectives_started(), op, std::chrono::steady_clock::now()});
    return std::make_shared<NcclWork>(ev);
  }

  // Retires completed collectives; a collective past the timeout, or an asynchronous NCCL
  // error, ends the process with a message naming the missing ranks (as torch's NCCL watchdog
  // does): a hung GPU collective cannot be cancelled from the thread that issued it.
  void monitor_loop() {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      while (!inflight_.empty() && cudaEventQuery(inflight_.front().event->event) == cudaSuccess) inflight_.pop_front();
      ncclResult_t async = ncclSuccess;
      if (comm_) ncclCommGetAsyncError(comm_, &async);  // null once aborted
      const bool overdue = !inflight_.empty() && std::chrono::steady_clock::now() - inflight_.front().started > timeout_;
      if (overdue || async != ncclSuccess) {
        const auto f = inflight_.empty() ? InFlight{nullptr, collectives_started(), "collective", {}} : inflight_.front();
        lock.unlock();
        const std::string why = async != ncclSuccess ? std::string(ncclGetErrorString(async))
                                                     : cat("timed out after ", human::seconds(timeout_.count() / 1000.0));
        std::string msg = cat(f.op, " on group '", name(), "' (nccl, collective #", f.seq, ") failed: ", why);
        msg += diagnosis(f.seq);
        log::error(msg);
        abort();
        std::fflush(stdout);
        std::fflush(stderr);
        std::_Exit(1);
      }
      cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
  }

  std::chrono::milliseconds timeout_;
  int device_;
  bool zero_cta_;                      // CTA policy zero: copy-engine collectives possible
  cudaStream_t own_stream_ = nullptr;  // where those run when the caller is on the default stream
  ncclComm_t comm_ = nullptr;
#if ME_NCCL_WINDOWS
  struct Window {
    void* ptr = nullptr;
    ncclWindow_t window = nullptr;
  };
  std::vector<Window> windows_;
#endif
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<InFlight> inflight_;
  bool stop_ = false;
  std::thread monitor_;
};

}  // namespace

bool nccl_available() { return true; }

std::string nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  return cat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

int select_cuda_device(int local_rank, int local_world, bool bind_cpus, std::string* binding) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  const int device = launch::pick_cuda_device(local_rank, count);
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  if (!bind_cpus) return device;
  auto bus_id = [](int d) {
    char bus[32] = {};
    return cudaDeviceGetPCIBusId(bus, sizeof bus, d) == cudaSuccess ? std::string(bus) : std::string();
  };
  const std::string mine = bus_id(device);
  std::string why = "not bound: cudaDeviceGetPCIBusId failed";
  if (!mine.empty()) {
    // The local ranks whose GPUs have the same CPUs as ours (each local rank drives GPU
    // local_rank when it sees several), and our place among them.
    int share_index = 0, share_count = 1;
    if (count > 1) {
      const std::string cpus = launch::device_cpu_list(mine);
      share_count = 0;
      for (int r = 0; r < std::min(local_world, count); ++r) {
        if (launch::device_cpu_list(bus_id(r)) != cpus) continue;
        if (r == local_rank) share_index = share_count;
        ++share_count;
      }
      share_count = std::max(share_count, 1);
    }
    why = launch::bind_to_device_cpus(mine, "/sys", share_index, share_count).why;
  }
  if (binding) *binding = why;
  return device;
}

std::unique_ptr<ProcessGroup> make_nccl_group(std::string name, std::vector<int> global_ranks, int global_rank,
                                              const c10::intrusive_ptr<c10d::Store>& store,
                                              std::chrono::milliseconds timeout, int device,
                                              const std::string& cta_policy) {
  return std::make_unique<NcclGroup>(std::move(name), std::move(global_ranks), global_rank, store, timeout, device,
                                     cta_policy);
}

#else

bool nccl_available() { return false; }
std::string nccl_version() { return "not built"; }
int select_cuda_device(int, int, bool, std::string*) { fail("this build of megaengine has no CUDA/NCCL support: use device=cpu"); }
std::unique_ptr<ProcessGroup> make_nccl_group(std::string name, std::vector<int>, int,
                                              const c10::intrusive_ptr<c10d::Store>&, std::chrono::milliseconds, int,
                                              const std::string&) {
  fail("group '", name, "': the nccl backend is not in this build (no CUDA LibTorch): use device=cpu with gloo");
}

#endif

}  // namespace me::comm
