// Memory the GPUs of one node's tensor-parallel group read and write directly, for collectives
// run by the copy engines (parallel.tp_comm_backend = "copy_engine"; parallel/collective_matmul.h):
// each rank cudaMallocs a region, exports it as a CUDA IPC handle, and maps every other rank's
// region into its own address space (NVLink peer access). A copy between two regions then runs
// on a copy engine, taking no multiprocessor from the GEMM beside it, which NCCL's kernels do
// (bench/RESULTS.md, twelfth session: a reduce-scatter beside a GEMM took twice its standalone time).
//
// A region is a signal pad (one 64-bit word per rank) and two data slots. Collectives alternate
// between the slots and each has one barrier, so that a rank writing a slot knows, by the
// barrier of the collective before, that every rank has finished reading what the slot held two
// collectives ago (the argument is spelt out in collective_matmul.cpp).
//
// Torch-free, like the rest of engine/kernels: raw pointers, the stream as void*. Errors are
// thrown as std::runtime_error naming the CUDA call.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace me::kernels {

class PeerBuffers {
 public:
  // This rank's region on the current device: two slots of `slot_bytes` and the signal pad.
  PeerBuffers(int rank, int size, size_t slot_bytes);
  ~PeerBuffers();
  PeerBuffers(const PeerBuffers&) = delete;
  PeerBuffers& operator=(const PeerBuffers&) = delete;

  static constexpr size_t kHandleBytes = 64;  // CUDA_IPC_HANDLE_SIZE
  // This rank's IPC handle, for the others.
  std::vector<uint8_t> handle() const;
  // Maps the other ranks' regions: handles holds size() x kHandleBytes, rank r's at r x kHandleBytes.
  void open(const std::vector<uint8_t>& handles);

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slot_bytes() const { return slot_bytes_; }
  // Slot `slot` (0 or 1) of rank r's region, as this process addresses it.
  void* slot(int r, int slot) const;
  // The slot the next collective uses (they alternate); each call moves on. The host counts these:
  // a sequence of collectives captured in a CUDA graph replays the slots it was captured with, so
  // it must take an even number of them (or end with a barrier), or two replays back to back
  // would give consecutive collectives the same slot.
  int next_slot() { return static_cast<int>(collectives_++ % 2); }

  // Queues on `stream` a wait for every rank of the group to reach the same barrier: each rank's
  // work queued before it (copies into a region included) is done and visible to the others
  // when the stream goes on. Every rank calls barriers in the same order. The barriers are
  // counted on the GPU, not by the host, so that a barrier captured in a CUDA graph counts as a
  // new one at every replay, as an eager one does (graphs and eager barriers may mix).
  // timed: the barrier's time on the GPU (mostly its wait for the last rank) is added to
  // timed_waits().
  void barrier(void* stream, bool timed = false);
  // The timed barriers so far: their GPU time in nanoseconds (for a barrier on the compute stream,
  // the time this rank's GPU waited for the other ranks, measured without a profiler: the rank
  // that waits least paces the others), their `count`, and each one's own time, the i-th at
  // ring[i % kWaitLog] (the last kWaitLog of them). Reads device memory (synchronous): at a log
  // interval, not per step.
  static constexpr int kWaitLog = 1024;
  struct TimedWaits {
    uint64_t total_ns = 0, count = 0;
    std::vector<uint64_t> ring;
  };
  TimedWaits timed_waits() const;

  // An asynchronous copy on `stream` (a copy engine when src and dst are on different GPUs).
  static void copy(void* dst, const void* src, size_t bytes, void* stream);

 private:
  int rank_, size_;
  size_t slot_bytes_;
  char* mine_ = nullptr;                 // this rank's region: pad, then the two slots
  std::vector<char*> regions_;           // every rank's region as mapped here (mine_ at rank_)
  uint64_t** device_pads_ = nullptr;     // the regions' signal pads, for the barrier kernel
  // Barriers so far, counted by the barrier kernel; then the timed ones' total nanoseconds, their
  // count and the ring of their times (TimedWaits).
  static constexpr int kCounterWords = 3 + kWaitLog;
  uint64_t* device_epoch_ = nullptr;
  uint64_t collectives_ = 0;
};

}  // namespace me::kernels
