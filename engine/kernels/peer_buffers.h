// Memory the GPUs of one node's tensor-parallel group read and write directly, for collectives
// run by the copy engines (parallel.tp_comm_backend = "copy_engine"; parallel/collective_matmul.h):
// each rank cudaMallocs a region, exports it as a CUDA IPC handle, and maps every other rank's
// region into its own address space (NVLink peer access). A copy between two regions then runs
// on a copy engine, taking no multiprocessor from the GEMM beside it, which NCCL's kernels do
// (bench/RESULTS.md, twelfth session: a reduce-scatter beside a GEMM took twice its standalone time).
//
// A region is a signal pad (three 64-bit words per rank: its barriers, arrivals and
// publications) and two data slots. Collectives alternate between the slots and each has one
// barrier, or one signal from every peer waited for, so that a rank writing a slot knows, by the
// collective before, that every rank has finished reading what the slot held two collectives ago
// (the argument is spelt out in collective_matmul.cpp).
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
  // The collectives so far (the next one's slot is collectives() % 2), and one slot passed over,
  // so that a replayed graph's collectives take the slots they were captured with. Only after a
  // barrier: the slot the next collective takes is then the one the last one took.
  uint64_t collectives() const { return collectives_; }
  void skip_slot() { ++collectives_; }

  // Queues on `stream` a wait for every rank of the group to reach the same barrier: each rank's
  // work queued before it (copies into a region included) is done and visible to the others
  // when the stream goes on. Every rank calls barriers in the same order. The barriers are
  // counted on the GPU, not by the host, so that a barrier captured in a CUDA graph counts as a
  // new one at every replay, as an eager one does (graphs and eager barriers may mix).
  // timed: the barrier's time on the GPU (mostly its wait for the last rank) is added to
  // timed_waits().
  void barrier(void* stream, bool timed = false);
  // Point to point instead of all to all: after this rank's copy into rank `to`'s region, queued
  // on the copy's stream, signal_arrival tells `to` that the copy is in; wait_arrivals queues on
  // `stream` a wait for one more arrival from every other rank than the last wait saw: every
  // peer's copies signalled before are then in and visible. Each rank signals every other once
  // per wait, in the same order of collectives. timed: as barrier's (timed_waits).
  // Eager only: the counts are the host's, so these refuse a stream that is capturing a graph.
  void signal_arrival(int to, void* stream);
  void wait_arrivals(void* stream, bool timed = false);
  // The same for an all-gather's pulls, one peer at a time: signal_published, queued after this
  // rank's rows are in its own slot, tells `to` they may be pulled; wait_published holds `stream`
  // (the pulls') until rank `from` has published as many times as this rank has to it (call it
  // after this rank's own signals of the same all-gather). No SM is used where the driver writes
  // and waits on the stream (cuStreamWriteValue64, cuStreamWaitValue64); else a kernel does.
  void signal_published(int to, void* stream);
  void wait_published(int from, void* stream);
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
  // Barriers so far, counted by the barrier kernel; arrival waits so far, counted by their
  // kernel; then the timed ones' total nanoseconds, their count and the ring of their times
  // (TimedWaits).
  static constexpr int kBarriers = 0, kArrivalWaits = 1, kTimed = 2;
  static constexpr int kCounterWords = kTimed + 2 + kWaitLog;
  uint64_t* device_epoch_ = nullptr;
  uint64_t collectives_ = 0;
  // `area`: the pad's word offset of arrivals or publications.
  void signal(int area, int to, void* stream);
  uint64_t& sent(int area, int r);  // signals of `area` sent to rank r so far
  static void not_capturing(void* stream, const char* what);  // throws inside a graph capture
  std::vector<uint64_t> sent_;  // arrivals, then publications, signalled to each rank so far
  bool signal_by_kernel_ = false;  // the driver refused cuStreamWriteValue64 into a peer's pad
  bool wait_by_kernel_ = false;    // or cuStreamWaitValue64 on this rank's
};

}  // namespace me::kernels
