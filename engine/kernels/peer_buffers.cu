#include "engine/kernels/peer_buffers.h"

#include "engine/kernels/common.cuh"

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace me::kernels {

namespace {

// The signal pad takes the region's first 768 bytes, so the slots stay aligned: a word per rank
// for its barriers, then a word per rank for its arrivals, then one for its publications (up to
// 32 ranks).
constexpr int kMaxRanks = 32;
constexpr int kArrivalWords = kMaxRanks, kPublishedWords = 2 * kMaxRanks;
constexpr size_t kPadBytes = 3 * kMaxRanks * sizeof(uint64_t);

void check(cudaError_t e, const char* what) { detail::check_call(e, "PeerBuffers", what); }

// Thread 0 counts this barrier (the count is its epoch); then one thread per other rank: tell rank
// j that this rank arrived (its word in j's pad), then wait for j's word in this rank's pad. The
// fences order this rank's earlier writes before its signal and the peers' writes before what
// follows the barrier on this stream. With `waited` (timed barriers), thread 0 adds the barrier's
// own time on the GPU, from its start to the last peer's arrival, to waited[0]: what its stream lost
// waiting for the other ranks, measured without a profiler; counts the timed barriers in
// waited[1] and keeps each one's time in the ring after them (PeerBuffers::kWaitLog entries).
__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Thread 0, at a timed wait's end: its time into the total, the count and the ring.
__device__ void add_timed_wait(unsigned long long* waited, unsigned long long start) {
  const unsigned long long ns = global_ns() - start;
  atomicAdd(waited, ns);
  const unsigned long long n = atomicAdd(waited + 1, 1ull);  // timed waits run on one stream, in order
  waited[2 + n % PeerBuffers::kWaitLog] = ns;
}

__global__ void barrier_kernel(uint64_t** pads, uint64_t* count, int rank, int size, unsigned long long* waited) {
  __shared__ uint64_t epoch;
  __shared__ unsigned long long start;
  if (threadIdx.x == 0) {
    epoch = ++*count;  // only this rank's barriers touch its count, in stream order
    if (waited) start = global_ns();
  }
  __syncthreads();
  const int j = static_cast<int>(threadIdx.x);
  if (j < size && j != rank) {
    __threadfence_system();
    volatile uint64_t* theirs = pads[j];
    theirs[rank] = epoch;
    volatile uint64_t* mine = pads[rank];
    while (mine[j] < epoch) {
    }
    __threadfence_system();
  }
  if (!waited) return;
  __syncthreads();
  if (threadIdx.x == 0) add_timed_wait(waited, start);
}

// A signal from one thread, where the driver will not write the value on the stream
// (PeerBuffers::signal): what the stream did before is done (stream order), and the fence orders
// it before the signal.
__global__ void signal_kernel(uint64_t* word, uint64_t n) {
  __threadfence_system();
  *reinterpret_cast<volatile uint64_t*>(word) = n;
}

// One thread: the stream waits until *word reaches `value` (where the driver will not wait on the
// stream itself).
__global__ void wait_value_kernel(const uint64_t* word, uint64_t value) {
  while (*reinterpret_cast<const volatile uint64_t*>(word) < value) {
  }
  __threadfence_system();
}

// One thread per other rank: wait until rank j's arrival word in this rank's pad reaches this
// wait's count (every wait expects one more arrival from each), then a fence so that what
// follows on this stream sees j's copies.
__global__ void wait_arrivals_kernel(uint64_t** pads, uint64_t* count, int rank, int size, unsigned long long* waited) {
  __shared__ uint64_t expected;
  __shared__ unsigned long long start;
  if (threadIdx.x == 0) {
    expected = ++*count;
    if (waited) start = global_ns();
  }
  __syncthreads();
  const int j = static_cast<int>(threadIdx.x);
  if (j < size && j != rank) {
    volatile uint64_t* mine = pads[rank] + kArrivalWords;
    while (mine[j] < expected) {
    }
    __threadfence_system();
  }
  if (!waited) return;
  __syncthreads();
  if (threadIdx.x == 0) add_timed_wait(waited, start);
}

// cuStreamWriteValue64 from the driver, through the runtime (no link to libcuda): a write that
// the stream's front end makes after what the stream queued before (its default flags fence the
// stream's earlier writes, as __threadfence_system does a thread's), on no multiprocessor, so
// that a signal after a copy does not wait for a GEMM's blocks to leave an SM.
// cuStreamWaitValue64 likewise: the front end holds the stream until a word reaches a value.
using StreamValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
// Null where the driver has no such entry point (the caller then uses a kernel).
StreamValue64 driver_entry(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();  // not sticky; cleared so that the next check does not report it
    return nullptr;
  }
  return reinterpret_cast<StreamValue64>(p);
}
StreamValue64 stream_write_value64() {
  static const StreamValue64 fn = driver_entry("cuStreamWriteValue64");
  return fn;
}
StreamValue64 stream_wait_value64() {
  static const StreamValue64 fn = driver_entry("cuStreamWaitValue64");
  return fn;
}

// Queues `fn`(stream, word, value, flags) unless this object already fell back to kernels
// (`by_kernel`); true when the driver took it. On its first refusal (or a missing entry point)
// says so once and sets `by_kernel`, and the caller's kernel does it from then on: a kernel
// needs an SM, which a GEMM beside it may hold a while.
bool by_driver(bool& by_kernel, StreamValue64 fn, const char* name, void* stream, void* word, uint64_t value,
               unsigned int flags) {
  if (by_kernel) return false;
  const CUresult r = fn ? fn(static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(word), value, flags)
                        : CUDA_ERROR_NOT_SUPPORTED;
  if (r == CUDA_SUCCESS) return true;
  std::fprintf(stderr, "PeerBuffers: %s on a signal pad failed (CUresult %d); a kernel does it instead\n", name,
               static_cast<int>(r));
  by_kernel = true;
  return false;
}

}  // namespace

PeerBuffers::PeerBuffers(int rank, int size, size_t slot_bytes) : rank_(rank), size_(size), slot_bytes_(slot_bytes) {
  if (size < 1 || size > kMaxRanks || rank < 0 || rank >= size)
    throw std::runtime_error("PeerBuffers: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                             " (at most " + std::to_string(kMaxRanks) + " ranks)");
  slot_bytes_ = (slot_bytes + 255) / 256 * 256;
  void* p = nullptr;
  check(cudaMalloc(&p, kPadBytes + 2 * slot_bytes_), "cudaMalloc of the region");
  mine_ = static_cast<char*>(p);
  check(cudaMemset(mine_, 0, kPadBytes), "clearing the signal pad");
  if (const auto e = cudaMalloc(&p, kCounterWords * sizeof(uint64_t)); e != cudaSuccess) {
    cudaFree(mine_);
    check(e, "cudaMalloc of the barrier count");
  }
  device_epoch_ = static_cast<uint64_t*>(p);  // the count, then the timed barriers' (TimedWaits)
  check(cudaMemset(device_epoch_, 0, kCounterWords * sizeof(uint64_t)), "clearing the barrier count");
  check(cudaDeviceSynchronize(), "clearing the signal pad");  // zero before any peer can signal
  regions_.assign(static_cast<size_t>(size), nullptr);
  sent_.assign(2 * static_cast<size_t>(size), 0);  // arrivals, then publications, to each rank
  regions_[static_cast<size_t>(rank)] = mine_;
}

PeerBuffers::~PeerBuffers() {
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && regions_[static_cast<size_t>(r)]) cudaIpcCloseMemHandle(regions_[static_cast<size_t>(r)]);
  if (device_pads_) cudaFree(device_pads_);
  if (device_epoch_) cudaFree(device_epoch_);
  if (mine_) cudaFree(mine_);
}

std::vector<uint8_t> PeerBuffers::handle() const {
  static_assert(sizeof(cudaIpcMemHandle_t) == kHandleBytes, "CUDA_IPC_HANDLE_SIZE changed");
  cudaIpcMemHandle_t h;
  check(cudaIpcGetMemHandle(&h, mine_), "cudaIpcGetMemHandle");
  std::vector<uint8_t> out(kHandleBytes);
  std::memcpy(out.data(), &h, kHandleBytes);
  return out;
}

void PeerBuffers::open(const std::vector<uint8_t>& handles) {
  if (handles.size() != static_cast<size_t>(size_) * kHandleBytes)
    throw std::runtime_error("PeerBuffers::open: expected " + std::to_string(size_) + " handles");
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handles.data() + static_cast<size_t>(r) * kHandleBytes, kHandleBytes);
    void* p = nullptr;
    check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
          ("cudaIpcOpenMemHandle of rank " + std::to_string(r) + "'s region (are the GPUs of one node, with peer access?)").c_str());
    regions_[static_cast<size_t>(r)] = static_cast<char*>(p);
  }
  std::vector<uint64_t*> pads(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) pads[static_cast<size_t>(r)] = reinterpret_cast<uint64_t*>(regions_[static_cast<size_t>(r)]);
  void* d = nullptr;
  check(cudaMalloc(&d, pads.size() * sizeof(uint64_t*)), "cudaMalloc of the pad table");
  device_pads_ = static_cast<uint64_t**>(d);
  check(cudaMemcpy(device_pads_, pads.data(), pads.size() * sizeof(uint64_t*), cudaMemcpyHostToDevice), "copying the pad table");
}

void* PeerBuffers::slot(int r, int slot) const {
  char* region = regions_.at(static_cast<size_t>(r));
  if (!region) throw std::runtime_error("PeerBuffers::slot: rank " + std::to_string(r) + "'s region is not open");
  return region + kPadBytes + static_cast<size_t>(slot) * slot_bytes_;
}

void PeerBuffers::barrier(void* stream, bool timed) {
  if (size_ == 1) return;
  if (!device_pads_) throw std::runtime_error("PeerBuffers::barrier before open()");
  auto* waited = timed ? reinterpret_cast<unsigned long long*>(device_epoch_ + kTimed) : nullptr;
  barrier_kernel<<<1, kMaxRanks, 0, static_cast<cudaStream_t>(stream)>>>(device_pads_, device_epoch_ + kBarriers,
                                                                           rank_, size_, waited);
  check(cudaGetLastError(), "barrier kernel launch");
}

uint64_t& PeerBuffers::sent(int area, int r) {
  // arrivals, then publications: a row of size_ counters each
  const int row = area == kArrivalWords ? 0 : area == kPublishedWords ? 1 : -1;
  if (row < 0) throw std::runtime_error("PeerBuffers: no signal area at word " + std::to_string(area));
  return sent_.at(static_cast<size_t>(row) * static_cast<size_t>(size_) + static_cast<size_t>(r));
}

// The signals count on the host (the values written, the publications waited for), so a CUDA
// graph would replay stale counts: eager only, unlike the barrier (counted on the GPU).
void PeerBuffers::not_capturing(void* stream, const char* what) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status), "cudaStreamIsCapturing");
  if (status != cudaStreamCaptureStatusNone)
    throw std::runtime_error(std::string("PeerBuffers: ") + what +
                             " inside a CUDA graph capture: the arrival and publication signals are eager only");
}

void PeerBuffers::signal(int area, int to, void* stream) {
  if (!device_pads_) throw std::runtime_error("PeerBuffers: a signal before open()");
  if (to < 0 || to >= size_ || to == rank_)
    throw std::runtime_error("PeerBuffers: a signal to rank " + std::to_string(to) + ", which is not a peer");
  not_capturing(stream, "a signal");
  // This rank's word in the area of to's pad: the count of such signals sent to `to` so far (only
  // one stream signals a given rank in an area, in order, so the host's count is the GPU's).
  auto* word = reinterpret_cast<uint64_t*>(regions_[static_cast<size_t>(to)]) + area + rank_;
  const uint64_t n = ++sent(area, to);
  if (by_driver(signal_by_kernel_, stream_write_value64(), "cuStreamWriteValue64", stream, word, n,
                CU_STREAM_WRITE_VALUE_DEFAULT))
    return;
  signal_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(word, n);
  check(cudaGetLastError(), "signal kernel launch");
}

void PeerBuffers::signal_arrival(int to, void* stream) { signal(kArrivalWords, to, stream); }

void PeerBuffers::signal_published(int to, void* stream) { signal(kPublishedWords, to, stream); }

void PeerBuffers::wait_published(int from, void* stream) {
  if (!device_pads_) throw std::runtime_error("PeerBuffers::wait_published before open()");
  if (from < 0 || from >= size_ || from == rank_)
    throw std::runtime_error("PeerBuffers::wait_published: rank " + std::to_string(from) + " is not a peer");
  // As many publications from `from` as this rank has sent it: every rank publishes to every
  // other once per all-gather, in the same order, and this rank has sent this one's already.
  not_capturing(stream, "wait_published");
  const uint64_t n = sent(kPublishedWords, from);
  auto* word = reinterpret_cast<uint64_t*>(mine_) + kPublishedWords + from;
  if (by_driver(wait_by_kernel_, stream_wait_value64(), "cuStreamWaitValue64", stream, word, n, CU_STREAM_WAIT_VALUE_GEQ))
    return;
  wait_value_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(word, n);
  check(cudaGetLastError(), "wait kernel launch");
}

void PeerBuffers::wait_arrivals(void* stream, bool timed) {
  if (size_ == 1) return;
  if (!device_pads_) throw std::runtime_error("PeerBuffers::wait_arrivals before open()");
  not_capturing(stream, "wait_arrivals");
  auto* waited = timed ? reinterpret_cast<unsigned long long*>(device_epoch_ + kTimed) : nullptr;
  wait_arrivals_kernel<<<1, kMaxRanks, 0, static_cast<cudaStream_t>(stream)>>>(device_pads_, device_epoch_ + kArrivalWaits,
                                                                                 rank_, size_, waited);
  check(cudaGetLastError(), "arrival wait kernel launch");
}

PeerBuffers::TimedWaits PeerBuffers::timed_waits() const {
  // Every stream's timed waits finished and their counts written: the compute stream need not be
  // the legacy default stream, which a plain cudaMemcpy would order after (a stream of LibTorch's pool, or one the caller made).
  check(cudaDeviceSynchronize(), "waiting for the timed barriers");
  std::vector<uint64_t> words(kCounterWords);
  check(cudaMemcpy(words.data(), device_epoch_, words.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost),
        "reading the barriers' times");
  TimedWaits w;
  w.total_ns = words[kTimed];
  w.count = words[kTimed + 1];
  w.ring.assign(words.begin() + kTimed + 2, words.end());
  return w;
}

void PeerBuffers::copy(void* dst, const void* src, size_t bytes, void* stream) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)), "cudaMemcpyAsync");  // peers by UVA
}

}  // namespace me::kernels
