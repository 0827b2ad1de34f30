#include "engine/kernels/peer_buffers.h"

#include <cuda_runtime.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace me::kernels {

namespace {

// The signal pad takes the region's first 256 bytes (up to 32 ranks), so the slots stay aligned.
constexpr size_t kPadBytes = 256;
constexpr int kMaxRanks = static_cast<int>(kPadBytes / sizeof(uint64_t));

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("PeerBuffers: ") + what + ": " + cudaGetErrorString(e));
}

// Thread 0 counts this barrier (the count is its epoch); then one thread per other rank: tell rank
// j that this rank arrived (its word in j's pad), then wait for j's word in this rank's pad. The
// fences order this rank's earlier writes before its signal and the peers' writes before what
// follows the barrier on this stream. With `waited` (timed barriers), thread 0 adds the barrier's
// own time on the GPU, from its start to the last peer's arrival, to waited[0]: what its stream lost
// waiting for the other ranks, measured without a profiler; counts the timed barriers in
// waited[1] and keeps each one's time in the ring after them (PeerBuffers::kWaitLog entries).
__global__ void barrier_kernel(uint64_t** pads, uint64_t* count, int rank, int size, unsigned long long* waited) {
  __shared__ uint64_t epoch;
  __shared__ unsigned long long start;
  if (threadIdx.x == 0) {
    epoch = ++*count;  // only this rank's barriers touch its count, in stream order
    if (waited) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
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
  if (threadIdx.x == 0) {
    unsigned long long end;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(end));
    atomicAdd(waited, end - start);
    const unsigned long long n = atomicAdd(waited + 1, 1ull);  // timed barriers run on one stream, in order
    waited[2 + n % PeerBuffers::kWaitLog] = end - start;
  }
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
  auto* waited = timed ? reinterpret_cast<unsigned long long*>(device_epoch_ + 1) : nullptr;
  barrier_kernel<<<1, kMaxRanks, 0, static_cast<cudaStream_t>(stream)>>>(device_pads_, device_epoch_, rank_, size_,
                                                                           waited);
  check(cudaGetLastError(), "barrier kernel launch");
}

PeerBuffers::TimedWaits PeerBuffers::timed_waits() const {
  std::vector<uint64_t> words(kCounterWords);
  check(cudaMemcpy(words.data(), device_epoch_, words.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost),
        "reading the barriers' times");
  TimedWaits w;
  w.total_ns = words[1];
  w.count = words[2];
  w.ring.assign(words.begin() + 3, words.end());
  return w;
}

void PeerBuffers::copy(void* dst, const void* src, size_t bytes, void* stream) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)), "cudaMemcpyAsync");  // peers by UVA
}

}  // namespace me::kernels
