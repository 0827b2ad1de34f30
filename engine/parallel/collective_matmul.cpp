#include "engine/parallel/collective_matmul.h"

#include "engine/core/build_config.h"  // ME_HAVE_CUDA_KERNELS
#include "engine/core/error.h"
#include "engine/core/graph_capture.h"
#include "engine/core/torch_compat.h"
#include "engine/kernels/fused_ops.h"
#include "engine/parallel/mappings.h"
#include "engine/parallel/symmetric_slots.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#if ME_TORCH_HAS_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <mutex>
#endif
#if ME_TORCH_HAS_CUDA && ME_HAVE_CUDA_KERNELS
#include "engine/kernels/kernels.h"
#include "engine/kernels/peer_buffers.h"
#define ME_PEER_COLLECTIVES 1
#else
#define ME_PEER_COLLECTIVES 0
#endif

namespace me::parallel {

namespace {
#if ME_TORCH_HAS_CUDA
// Side streams kept per GPU, by use: `index` 0 for the NCCL collectives and -1 for the
// copy-engine barriers (both high priority), k >= 1 for the copies to or from the k-th peer of
// the copy-engine collectives.
c10::cuda::CUDAStream side_stream(c10::DeviceIndex device, int index) {
  static std::mutex mutex;
  static std::map<std::pair<c10::DeviceIndex, int>, c10::cuda::CUDAStream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams.find({device, index});
  if (it == streams.end())
    it = streams.emplace(std::make_pair(device, index), c10::cuda::getStreamFromPool(index <= 0, device)).first;
  return it->second;
}
c10::cuda::CUDAStream tp_stream(c10::DeviceIndex device) { return side_stream(device, 0); }
#endif

torch::Tensor rows2d(const torch::Tensor& t) { return t.view({-1, t.size(-1)}); }

#if ME_PEER_COLLECTIVES
// ---- collectives on the copy engines (parallel.tp_comm_backend = "copy_engine") --------------
// Each collective takes the next of the peer buffers' two slots and queues one barrier: an
// all-gather's on the signal stream, so that the GEMM of this rank's own rows does not wait for
// the last rank to arrive (at tp 4 the ranks' hosts drift apart by milliseconds), a
// reduce-scatter's on the compute stream, whose sums need it. Why a slot is free when a rank
// writes it: a rank writes slot s (its own in an all-gather, a peer's in a reduce-scatter) only
// after its barrier of the collective before (the signal stream runs in order, and the compute
// stream has waited for that barrier, directly or through the pulls after it), which no rank
// passes before every rank has queued it; and each rank queues a barrier only after its compute
// stream has waited for its reads of the collective before that, the last to use slot s (the
// pulled copies, or the sums of what was pushed to it): the signal stream waits for the compute
// stream at the start of each all-gather.
// With the reduce-scatters' arrival signals instead of their barriers (the default;
// ME_TP_RS_SIGNALS=0 for the barriers), a reduce-scatter's wait on the compute stream is for one
// signal from every peer, each sent after that peer's push into this rank, which its push stream
// queued after everything its compute stream had queued before the reduce-scatter: its reads of
// every earlier collective included. So the wait, like a barrier, tells this rank that every rank
// is done with the collective before; the argument above holds with it in place of the
// reduce-scatter's barrier. Likewise the all-gathers' publication signals (the default;
// ME_TP_AG_SIGNALS=0 for their barrier): each peer signals after its compute stream reached the
// all-gather (its earlier reads done), this rank pulls from every peer after that peer's signal,
// and its compute stream waits for every pull before it goes on.

// Copy streams: the reduce-scatters push to the k-th peer on the k-th, as each chunk is computed;
// the all-gathers pull on the first, one peer after another.
c10::cuda::CUDAStream peer_stream(c10::DeviceIndex device, int k) { return side_stream(device, k); }
// The all-gathers' barriers, apart from the compute stream (high priority: one small block).
c10::cuda::CUDAStream signal_stream(c10::DeviceIndex device) { return side_stream(device, -1); }

size_t nbytes(const torch::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

bool peers_take(const torch::Tensor& t, const TensorParallel& tp, size_t bytes) {
  return tp.peers && t.is_cuda() && bytes <= tp.peers->slot_bytes();
}

// Events reused from one collective to the next instead of made and destroyed for each (two
// driver calls saved per event; at tp 4 the step waits for the slowest rank's host). Reuse is
// safe because every event here is waited for (cudaStreamWaitEvent takes the event as it is at
// that call) before it is recorded again. Per thread: the forward's and autograd's threads each
// keep their own. `use`: which of a collective's events (0 .. 2 x kMaxPeers).
constexpr int kMaxPeers = 32;
at::cuda::CUDAEvent& reused_event(c10::DeviceIndex device, int use) {
  thread_local std::map<std::pair<c10::DeviceIndex, int>, at::cuda::CUDAEvent> events;
  return events[{device, use}];
}
enum EventUse { kPublished = 0, kArrived = 1, kPushed = 1 + kMaxPeers, kReady = 1 + 2 * kMaxPeers, kInputReady };

// A default that the environment variable `name` turns off when it is "0" (a diagnosis).
bool on_unless_zero(const char* name) {
  const char* v = std::getenv(name);
  return !(v && std::string(v) == "0");
}

// Whether the all-gathers' pulls wait for their peer's signal that its rows are in its slot,
// each pull for its own peer only, instead of a barrier of all ranks before the first: the
// default; ME_TP_AG_SIGNALS=0 brings the barrier back (a diagnosis: the same copies in the same
// order). With the reduce-scatters' signals the ranks no longer meet at every reduce-scatter, and
// an all-gather's barrier would make them meet there instead (thirtieth session, 4 x H100:
// both signals faster than both barriers in five paired runs of tp 4 + SP, 0.2-0.4 ms a layer in four).
// Inside a CUDA graph capture the barrier instead: the signals' counts are the host's, which a
// replay would not advance (the barriers are counted on the GPU).
bool gather_signals() {
  static const bool on = on_unless_zero("ME_TP_AG_SIGNALS");
  return on && !graph_capture_underway();
}

// The copy engines' all-gather, started: on the compute stream this rank's rows into its slot and
// into the result (one kernel that reads them once, kernels::copy_twice), then a barrier on the
// signal stream (so that the compute stream does not wait for the last rank to arrive: at tp 4 the
// ranks drift apart), then on one copy stream every peer's rows pulled from its slot, one peer
// after another, in ring order, each pull's event recorded. The two local copies are on the compute
// stream because a copy within one GPU runs on its multiprocessors, not on a copy engine: beside a
// GEMM it waited for the GEMM's last wave (session 26, tp 2: own rows up to 1.4 ms late, the peers'
// pulls behind them, and the next GEMM waiting 50-70 us for them; dev/cuda/peer_buffers shows a
// local copy queued beside a GEMM ending with it, with or without
// cudaMemcpyFlagPreferOverlapWithCompute). Queued first, they take ~10 us at full speed, and the
// pulls then run beside the whole GEMM. As one kernel they read the rows once: three passes over
// them instead of four, and one launch.
// One copy stream for the pulls: they share this GPU's NVLink bandwidth anyway
// (dev/cuda/peer_buffers: three peers at once are no faster than one after another), and in order
// each peer's rows land when the GEMM that waits for them comes next (on three streams the copy
// engines served them in any order: the twenty-fourth session's trace). The result needs no
// record_stream: the caller makes the compute stream wait for every pull (wait_for_pull) before the
// result is used elsewhere, so the allocator's stream-ordered reuse of its block is safe.
struct PeerGather {
  torch::Tensor gathered;  // [b, s, ...]
  int64_t rows = 0;        // each rank's rows
};
PeerGather start_peer_all_gather(const torch::Tensor& in, const TensorParallel& tp) {
  auto& peers = *tp.peers;
  const int size = peers.size(), rank = peers.rank();
  ME_CHECK(size <= kMaxPeers, "copy-engine collectives: at most ", kMaxPeers, " ranks, got ", size);
  const auto device = in.device().index();
  const auto compute = c10::cuda::getCurrentCUDAStream(device);
  const auto local = rows2d(in);
  const size_t bytes = nbytes(local);
  PeerGather g{torch::empty(gathered_tokens_shape(in, size), in.options()), local.size(0)};
  char* all = static_cast<char*>(g.gathered.data_ptr());
  const int s = peers.next_slot();
  kernels::copy_twice(peers.slot(rank, s), all + static_cast<size_t>(rank) * bytes, local.data_ptr(), bytes,
                      compute.stream());
  const auto signal = signal_stream(device);
  auto& input_ready = reused_event(device, kInputReady);
  input_ready.record(compute);
  input_ready.block(signal);
  const bool signals = gather_signals();
  if (signals)  // each peer may pull this rank's rows now; the pulls below wait for their peer's only
    for (int k = 1; k < size; ++k) peers.signal_published((rank + k) % size, signal.stream());
  else
    peers.barrier(signal.stream());
  auto& published = reused_event(device, kPublished);
  published.record(signal);
  const auto pulls = peer_stream(device, 1);
  published.block(pulls);
  for (int k = 1; k < size; ++k) {
    const int from = (rank + k) % size;
    if (signals) peers.wait_published(from, pulls.stream());
    kernels::PeerBuffers::copy(all + static_cast<size_t>(from) * bytes, peers.slot(from, s), bytes, pulls.stream());
    reused_event(device, kArrived + k).record(pulls);
  }
  return g;
}

// The compute stream waits for the k-th pull of start_peer_all_gather (k = 1 .. size - 1).
void wait_for_pull(c10::DeviceIndex device, int k) {
  reused_event(device, kArrived + k).block(c10::cuda::getCurrentCUDAStream(device));
}

// all_gather_rows on the copy engines: the GEMM of this rank's own rows while the pulls run, then
// the peers' rows as soon as they have landed, gather_group_for() peers' contiguous rows at a time.
torch::Tensor peer_all_gather_rows(const torch::Tensor& in, const TensorParallel& tp, const RowsInto& rows,
                                   int64_t out_cols) {
  const auto g = start_peer_all_gather(in, tp);
  const int size = tp.peers->size(), rank = tp.peers->rank();
  const auto all_rows = rows2d(g.gathered);
  rows(rows2d(in), g.rows * rank);
  for (const auto& run : peer_runs(rank, size, gather_group_for(out_cols, size))) {
    wait_for_pull(in.device().index(), run.last_pull);  // one copy stream: the earlier pulls are in too
    rows(all_rows.narrow(0, g.rows * run.first, g.rows * run.count), g.rows * run.first);
  }
  return g.gathered;
}

// Pushes `piece`, rows of this rank's partial sums for rank `to`, into to's slot s at `offset`
// bytes (this rank's place in it, and the piece's within that), on a copy stream after what the
// compute stream has queued. The caller keeps `piece` alive until finish_peer_reduce_scatter has
// made the compute stream wait for the push (instead of record_stream, whose events the allocator
// would poll).
void push_partial(const torch::Tensor& piece, int to, int s, size_t offset, kernels::PeerBuffers& peers,
                  c10::DeviceIndex device, int k) {
  const auto stream = peer_stream(device, k);
  auto& ready = reused_event(device, kReady);
  ready.record(c10::cuda::getCurrentCUDAStream(device));
  ready.block(stream);
  kernels::PeerBuffers::copy(static_cast<char*>(peers.slot(to, s)) + offset, piece.data_ptr(), nbytes(piece),
                             stream.stream());
}

// This rank's own chunk plus what each peer pushed into slot s, then `bias` if given, in one pass
// (kernels::sum_parts, the bits of an add_ per part in this order), into `out`: own itself, or a
// new tensor.
void sum_received(const torch::Tensor& own, torch::Tensor& out, int s, kernels::PeerBuffers& peers,
                  const c10::cuda::CUDAStream& compute, const torch::Tensor& bias) {
  const size_t bytes = nbytes(own);
  std::vector<const void*> parts;
  for (int k = 1; k < peers.size(); ++k) {
    const int from = (peers.rank() - k + peers.size()) % peers.size();
    parts.push_back(static_cast<char*>(peers.slot(peers.rank(), s)) + static_cast<size_t>(from) * bytes);
  }
  const auto type = own.scalar_type();
  const bool fused_bias = !bias.defined() || (bias.scalar_type() == type && bias.is_contiguous() &&
                                               bias.dim() == 1 && bias.numel() == own.size(-1));
  if ((type == torch::kBFloat16 || type == torch::kFloat) && own.is_contiguous() && fused_bias &&
      parts.size() <= static_cast<size_t>(kernels::kMaxSumParts)) {
    kernels::sum_parts(type == torch::kFloat ? kernels::DType::f32 : kernels::DType::bf16, out.data_ptr(),
                       own.data_ptr(), parts.data(), static_cast<int>(parts.size()), own.numel(), compute.stream(),
                       bias.defined() ? bias.data_ptr() : nullptr, bias.defined() ? bias.numel() : 0);
    return;
  }
  if (!out.is_same(own)) out.copy_(own);
  for (const void* part : parts) out.add_(torch::from_blob(const_cast<void*>(part), own.sizes(), own.options()));
  if (bias.defined()) out.add_(bias);
}

// Whether the reduce-scatters wait for an arrival signal from each peer (sent after its pushes
// into this rank) instead of a barrier of all ranks: the default; ME_TP_RS_SIGNALS=0 brings the
// barrier back. The sum needs only the pushes into this rank, and two of the three peers push a
// chunk or two before their GEMMs end; a barrier also waited for the slowest rank's own pushes.
bool reduce_scatter_signals() {  // as gather_signals: not inside a graph capture
  static const bool on = on_unless_zero("ME_TP_RS_SIGNALS");
  return on && !graph_capture_underway();
}

// After the pushes into rank `to` (the k-th push stream's), with reduce_scatter_signals().
void signal_pushed(kernels::PeerBuffers& peers, int to, c10::DeviceIndex device, int k) {
  if (reduce_scatter_signals()) peers.signal_arrival(to, peer_stream(device, k).stream());
}

// The compute stream waits for this rank's own pushes (their sources may be freed after).
void wait_for_pushes(kernels::PeerBuffers& peers, c10::DeviceIndex device, const c10::cuda::CUDAStream& compute) {
  for (int k = 1; k < peers.size(); ++k) {
    auto& pushed = reused_event(device, kPushed + k);
    pushed.record(peer_stream(device, k));
    pushed.block(compute);
  }
}

// After the pushes: the compute stream waits for them and the barrier (every rank's pushes into
// this rank's slot are in), or with reduce_scatter_signals() for each peer's signal only; then
// sum_received, into `own` itself, or with `fresh` into a new tensor (own is then a view into a
// larger buffer, which the sum must not keep).
torch::Tensor finish_peer_reduce_scatter(torch::Tensor own, int s, kernels::PeerBuffers& peers, c10::DeviceIndex device,
                                         bool fresh, const torch::Tensor& bias = {}) {
  const auto compute = c10::cuda::getCurrentCUDAStream(device);
  auto out = fresh ? torch::empty(own.sizes(), own.options()) : own;
  if (reduce_scatter_signals()) {
    // The sum waits only for what was pushed into this rank; this rank's own pushes, after it.
    peers.wait_arrivals(compute.stream(), /*timed=*/true);
    sum_received(own, out, s, peers, compute, bias);
    wait_for_pushes(peers, device, compute);
    return out;
  }
  wait_for_pushes(peers, device, compute);
  peers.barrier(compute.stream(), /*timed=*/true);  // the compute stream's wait for the other ranks
  sum_received(own, out, s, peers, compute, bias);
  return out;
}
#endif
}  // namespace

std::vector<PeerRun> peer_runs(int rank, int size, int group) {
  std::vector<PeerRun> runs;
  for (int k = 1; k < size;) {
    PeerRun r{(rank + k) % size, 1, 0};
    while (r.count < group && k + r.count < size && r.first + r.count < size) ++r.count;
    r.last_pull = k + r.count - 1;
    runs.push_back(r);
    k += r.count;
  }
  return runs;
}

namespace {
// ME_TP_GATHER_GROUP, when set (an experiment; 1: each peer's rows as soon as they land), else 0.
int fixed_gather_group() {
  static const int group = [] {
    const char* v = std::getenv("ME_TP_GATHER_GROUP");
    return v ? std::max(1, std::atoi(v)) : 0;
  }();
  return group;
}

// The GEMM's output columns per peer above which the GEMM of this rank's own rows outlasts the
// pulls of every peer's rows, so that one GEMM over the peers' rows waits for nothing. Per row the
// GEMM does 2 K N flops and a pull moves 2 K bytes, so it outlasts tp - 1 pulls when
// N / rate >= (tp - 1) / bandwidth. On 4 x H200 (bench/RESULTS.md, thirty-second session) the pulls
// ran at 230-265 GB/s, one peer after another, and the chunk GEMMs at 610-720 TFLOP/s: about 2,800
// columns per peer, here with a quarter more for margin.
constexpr int64_t kColsPerPeerToGroup = 3500;
}  // namespace

// Chunks of a thousand rows lost 10-20% of a GEMM's rate against the whole in the same session
// (LLaMA-2-70B width, tp 4: QKV chunks at 627 TFLOP/s, the output projection's at 614, against
// 777-780 unsplit on one GPU). At tp 4 the LLaMA-2-70B width's gate/up GEMM
// (N 14,336) takes the three peers' rows at once, and its QKV (2,560) and the GPT-39B width's
// GEMMs (6,144 and 8,192) stay per peer, where the pulls take about as long as the GEMMs.
int gather_group_for(int64_t out_cols, int size) {
  if (const int fixed = fixed_gather_group()) return fixed;
  return out_cols >= kColsPerPeerToGroup * (size - 1) ? size - 1 : 1;
}

std::function<void()> start_collective(const std::vector<torch::Tensor>& uses, const std::function<void()>& collective,
                                       torch::Tensor* produced) {
#if ME_TORCH_HAS_CUDA
  if (!uses.empty() && uses.front().is_cuda()) {
    const auto index = uses.front().device().index();
    const auto compute = c10::cuda::getCurrentCUDAStream(index);
    const auto side = tp_stream(index);
    at::cuda::CUDAEvent ready;
    ready.record(compute);
    ready.block(side);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      collective();
    }
    // The allocator must not hand these blocks out again before both streams are done: `uses`
    // ride in the returned function, so they are freed (to the compute stream) only after it
    // made the compute stream wait for the side stream; no record_stream, whose events the
    // allocator would poll on every allocation. What the side stream allocated is the compute
    // stream's from now on.
    if (produced && produced->defined()) produced->record_stream(compute);
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(side);
    return [done, compute, keep = uses] { done->block(compute); };
  }
#endif
  collective();
  return [] {};
}

SmMarginForCollective::SmMarginForCollective(const torch::Tensor& on, const TensorParallel& tp)
    : SmMarginForCollective(on, static_cast<int>(tp.comm_sm_margin)) {}

SmMarginForCollective::SmMarginForCollective(const torch::Tensor& on, int margin) {
#if ME_TORCH_HAS_CUDA
  if (margin <= 0 || !on.is_cuda()) return;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  ME_CHECK(margin < sms, "an SM margin of ", margin, " (parallel.tp_comm_sm_margin or ME_TP_WGRAD_STREAM) must leave the ",
           "GEMMs some of this GPU's ", sms, " multiprocessors");
  const int target = sms - margin;
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  ME_CHECK(cublasGetSmCountTarget(handle, &previous_) == CUBLAS_STATUS_SUCCESS &&
               cublasSetSmCountTarget(handle, target) == CUBLAS_STATUS_SUCCESS,
           "cublasSetSmCountTarget(", target, ") failed");
  handle_ = handle;
  compat::set_matmul_sm_carveout(margin);  // LibTorch's cuBLASLt GEMMs, where it has the setting
  kernels::set_gemm_sm_count_target(target);         // ours (GeLU epilogues)
#else
  (void)on;
  (void)margin;
#endif
}

SmMarginForCollective::~SmMarginForCollective() {
#if ME_TORCH_HAS_CUDA
  if (!handle_) return;
  cublasSetSmCountTarget(static_cast<cublasHandle_t>(handle_), previous_);
  compat::set_matmul_sm_carveout(std::nullopt);
  kernels::set_gemm_sm_count_target(0);
#endif
}

namespace {
// all_gather_rows as a ring of exchanges (parallel.tp_gather = "ring"): at step k this rank's
// rows go to rank + k and rank - k's arrive, on the side stream one step after the other, while
// the compute stream multiplies this rank's rows, then each peer's as soon as its step is done;
// the collective is hidden behind all but the first 1 / tp of the GEMM.
torch::Tensor ring_all_gather_rows(const torch::Tensor& in, const TensorParallel& tp, const RowsInto& rows) {
  auto& group = *tp.group;
  const int size = group.size(), rank = group.rank();
  auto gathered = torch::empty(gathered_tokens_shape(in, size), in.options());
  const auto local = rows2d(in), all = rows2d(gathered);
  const int64_t m = local.size(0);
  std::vector<std::function<void()>> arrived;
  for (int k = 1; k < size; ++k) {
    const int to = (rank + k) % size, from = (rank - k + size) % size;
    auto into = all.narrow(0, m * from, m);
    arrived.push_back(start_collective({in, gathered}, [&] {
      group.send_recv({{comm::PeerOp::send, local, to}, {comm::PeerOp::recv, into, from}});
    }));
  }
  all.narrow(0, m * rank, m).copy_(local);
  for (int k = 0; k < size; ++k) {
    const int64_t from = m * ((rank - k + size) % size);
    if (k > 0) arrived[static_cast<size_t>(k - 1)]();
    std::optional<SmMarginForCollective> margin;  // while exchanges still run beside
    if (k + 1 < size) margin.emplace(in, tp);
    rows(all.narrow(0, from, m), from);
  }
  return gathered;
}
}  // namespace

torch::Tensor all_gather_rows(const torch::Tensor& local, const TensorParallel& tp, const RowsInto& rows,
                              int64_t out_cols) {
  ME_CHECK(local.dim() >= 2, "all_gather_rows: expected [batch, seq / tp, ...], got shape ", local.sizes());
  auto in = local.contiguous();
#if ME_PEER_COLLECTIVES
  if (peers_take(in, tp, nbytes(in))) return peer_all_gather_rows(in, tp, rows, out_cols);
#endif
  if (tp.gather_ring && !tp.slots) return ring_all_gather_rows(in, tp, rows);
  auto& group = *tp.group;
  const auto sizes = gathered_tokens_shape(in, group.size());
  const int64_t m = rows2d(in).size(0), first = m * group.rank(), total = m * group.size();
  // In a registered slot (parallel.tp_symmetric_mb) the gather runs in place: this rank's rows
  // are copied to where the gather expects them first.
  auto gathered = tp.slots ? tp.slots->take(sizes, in.options()) : torch::Tensor();
  std::function<void()> join;
  if (gathered.defined()) {
    auto mine = rows2d(gathered).narrow(0, first, m);
    mine.copy_(rows2d(in));
    join = start_collective({in, gathered}, [&] { group.all_gather(gathered, mine); });
  } else {
    gathered = torch::empty(sizes, in.options());
    join = start_collective({in, gathered}, [&] { group.all_gather(gathered, in); });
  }
  {
    SmMarginForCollective margin(in, tp);
    rows(rows2d(in), first);
  }
  join();
  const auto all = rows2d(gathered);
  if (first > 0) rows(all.narrow(0, 0, first), 0);
  if (first + m < total) rows(all.narrow(0, first + m, total - first - m), first + m);
  return gathered;
}

torch::Tensor all_gather_beside(const torch::Tensor& local, const TensorParallel& tp, const std::function<void()>& beside) {
  ME_CHECK(local.dim() >= 2, "all_gather_beside: expected [batch, seq / tp, ...], got shape ", local.sizes());
  auto in = local.contiguous();
#if ME_PEER_COLLECTIVES
  if (peers_take(in, tp, nbytes(in))) {
    auto g = start_peer_all_gather(in, tp);
    beside();
    for (int k = 1; k < tp.peers->size(); ++k) wait_for_pull(in.device().index(), k);
    return g.gathered;
  }
#endif
  auto& group = *tp.group;
  auto gathered = torch::empty(gathered_tokens_shape(in, group.size()), in.options());
  auto join = start_collective({in, gathered}, [&] { group.all_gather(gathered, in); });
  {
    SmMarginForCollective margin(in, tp);
    beside();
  }
  join();
  return gathered;
}

torch::Tensor reduce_scatter_rows(int64_t chunk_rows, const TensorParallel& tp,
                                  const std::function<torch::Tensor(int64_t first, int64_t n)>& partial,
                                  const torch::Tensor& bias) {
  auto& group = *tp.group;
  const int size = group.size(), rank = group.rank();
#if ME_PEER_COLLECTIVES
  if (tp.peers) {  // the chunk's size is known once the first is computed
    const int s = tp.peers->next_slot();
    std::vector<torch::Tensor> pushed;  // alive until the compute stream has waited for the pushes
    for (int step = 1; step < size; ++step) {
      const int to = (rank + step) % size;
      auto mine = partial(to * chunk_rows, chunk_rows).contiguous();
      const size_t chunk = nbytes(mine);
      ME_CHECK(mine.is_cuda() && chunk * static_cast<size_t>(size) <= tp.peers->slot_bytes(),
               "parallel.tp_comm_backend = \"copy_engine\": a reduce-scatter of ", chunk * size,
               " bytes does not fit the peer buffers' ", tp.peers->slot_bytes(),
               " (sized from batch.micro x model.seq x model.hidden)");
      push_partial(mine, to, s, static_cast<size_t>(rank) * chunk, *tp.peers, mine.device().index(), step);
      signal_pushed(*tp.peers, to, mine.device().index(), step);
      pushed.push_back(std::move(mine));
    }
    auto own = partial(rank * chunk_rows, chunk_rows).contiguous();
    return finish_peer_reduce_scatter(own, s, *tp.peers, own.device().index(), /*fresh=*/false, bias);
  }
#endif
  std::vector<torch::Tensor> received;
  std::vector<std::function<void()>> joins;
  std::optional<SmMarginForCollective> margin;  // from the second GEMM on, a send runs beside each
  for (int step = 1; step < size; ++step) {
    const int to = (rank + step) % size, from = (rank - step + size) % size;
    auto mine = partial(to * chunk_rows, chunk_rows).contiguous();
    if (!margin) margin.emplace(mine, tp);
    auto theirs = torch::empty_like(mine);
    joins.push_back(start_collective({mine, theirs}, [&] {
      group.send_recv({{comm::PeerOp::send, mine, to}, {comm::PeerOp::recv, theirs, from}});
    }));
    received.push_back(theirs);
  }
  auto own = partial(rank * chunk_rows, chunk_rows).contiguous();
  margin.reset();
  for (auto& join : joins) join();
  for (const auto& r : received) own.add_(r);
  if (bias.defined()) own.add_(bias);
  return own;
}

std::function<torch::Tensor()> start_peer_reduce_scatter(const torch::Tensor& full, const TensorParallel& tp) {
#if ME_PEER_COLLECTIVES
  if (!tp.peers || !full.is_cuda() || nbytes(full) > tp.peers->slot_bytes()) return {};
  auto& peers = *tp.peers;
  const auto rows = rows2d(full.contiguous());
  const int64_t m = rows.size(0) / peers.size();
  const int s = peers.next_slot();
  const auto device = full.device().index();
  for (int k = 1; k < peers.size(); ++k) {
    const int to = (peers.rank() + k) % peers.size();
    const auto chunk = rows.narrow(0, to * m, m);
    push_partial(chunk, to, s, static_cast<size_t>(peers.rank()) * nbytes(chunk), peers, device, k);
    signal_pushed(peers, to, device, k);
  }
  auto sizes = full.sizes().vec();
  sizes[1] /= peers.size();
  auto own = rows.narrow(0, peers.rank() * m, m);
  // `rows` rides along: the pushes read it until the compute stream waits for them in finish,
  // and the sum reads this rank's rows of it into a tensor of its own.
  return [own, keep = rows, s, &peers, device, sizes]() mutable {
    auto sum = finish_peer_reduce_scatter(own, s, peers, device, /*fresh=*/true).view(sizes);
    own = torch::Tensor();
    keep = torch::Tensor();
    return sum;
  };
#else
  (void)full;
  (void)tp;
  return {};
#endif
}

}  // namespace me::parallel
