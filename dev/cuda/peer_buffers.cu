// engine/kernels/peer_buffers.h on the GPUs of this machine, one process per GPU (forked; CUDA
// IPC needs separate processes), as tensor parallelism uses it:
//   1. checks: an all-gather that pulls every peer's slot after a barrier, and a reduce-scatter
//      that pushes a chunk into each peer's slot, barriers and sums, over several rounds that
//      alternate the slots (a stale or early read shows as a wrong value);
//   1b. the same all-gather captured in a CUDA graph and replayed: each replay's barriers count as
//      new ones (the count is on the GPU), and each replay gathers that replay's values (a round
//      number kept on the GPU), mixed with eager barriers before and after;
//   1c. timed barriers: a rank that arrives late adds its lateness to the others' timed waits;
//   1d. arrival signals (ME_TP_RS_SIGNALS): each rank pushes into every peer's slot on a copy stream
//      and signals it (cuStreamWriteValue64 after the copy), the last rank 2 ms late; every rank's
//      compute stream waits for the arrivals only, then copies what landed: a signal ahead of its
//      data shows as a stale value (the rounds alternate values); then an all-gather whose pulls
//      each wait for their peer's publication signal (ME_TP_AG_SIGNALS), the fill ordered before
//      the signals by an event only, as in the engine;
//   2. bandwidth of the copy engines: one peer's chunk pulled alone, and all peers' at once;
//      2b. every rank at once (an all-gather's traffic), by pulls and by pushes;
//   3. what a copy beside a GEMM costs: a bf16 GEMM alone, then with the pulls running on
//      another stream (the GEMM's slowdown and the copies' bandwidth), which NCCL's kernels
//      doubled on the same machine;
//   4. the host's side: microseconds per call of what tensor parallelism's copy-engine path issues
//      per collective (copies from a peer's region and local ones, an event's record and wait,
//      the barrier kernel, and CUDA 13's batched copy), issued back to back on small chunks so the
//      GPU keeps up and the loop times the host alone (at tp 4 that path costs the host 3.4 ms a
//      layer and micro-batch against 1.7 for NCCL's all-reduce: bench/RESULTS.md, 21st session).
//   build/dev/cuda/peer_buffers [gpus] [MiB per chunk]     (default: every GPU, 16 MiB)
#include <cublas_v2.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "dev/cuda/common.h"
#include "engine/kernels/peer_buffers.h"

namespace {

using me::kernels::PeerBuffers;

// Shared by the forked ranks (mapped before fork): their IPC handles and a spin barrier.
struct Shared {
  std::atomic<int> arrived[128];
  uint8_t handles[32 * PeerBuffers::kHandleBytes];
  std::atomic<int> failures;
  double us[4][32];  // 2b: each rank's microseconds per exchange, by pattern
};

void host_barrier(Shared* s, int n, int round) {
  s->arrived[round].fetch_add(1);
  while (s->arrived[round].load() < n) std::this_thread::yield();
}

__global__ void fill(float* p, size_t n, float value) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) p[i] = value;
}

// The graph check's fill: this rank's slot gets 1000 x round + rank, the round counted on the GPU
// (a captured kernel argument would repeat at every replay).
__global__ void next_round(int* round) { ++*round; }
__global__ void fill_round(float* p, size_t n, const int* round, int rank) {
  const float value = static_cast<float>(1000 * *round + rank);
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) p[i] = value;
}

// Keeps the GPU busy for `ns` nanoseconds (a late rank, for the timed barrier's check).
__global__ void spin(long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (static_cast<long long>(now - start) < ns);
}

bool all_equal(const float* device, size_t n, float value) {
  std::vector<float> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (float x : h)
    if (x != value) return false;
  return true;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// 4. microseconds of host per call (rank 0 prints; every rank takes part in the barriers).
void host_calls(int rank, int n, PeerBuffers& peers, float* gathered, cudaStream_t compute, cudaStream_t copies,
                Shared* shared, int& round) {
  const int calls = 500;
  const size_t small = 64 << 10;  // 64 KiB: a copy engine moves it in about a microsecond
  auto per_call = [&](const std::function<void()>& issue) {
    issue();
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) issue();
    const double us = ms_since(t0) * 1e3 / calls;
    CUDA_CHECK(cudaDeviceSynchronize());
    return us;
  };
  if (rank == 0) {
    char* dst = reinterpret_cast<char*>(gathered);
    const double peer = per_call([&] { PeerBuffers::copy(dst, peers.slot(1, 0), small, copies); });
    const double local = per_call([&] { PeerBuffers::copy(dst + small, dst, small, copies); });
    cudaEvent_t event;
    CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    const double record_wait = per_call([&] {
      CUDA_CHECK(cudaEventRecord(event, compute));
      CUDA_CHECK(cudaStreamWaitEvent(copies, event, 0));
    });
    CUDA_CHECK(cudaEventDestroy(event));
    std::printf("host per call: copy from a peer's region %.2f us, local copy %.2f us, event record + wait %.2f us\n",
                peer, local, record_wait);
#if CUDART_VERSION >= 13000
    std::vector<void*> dsts, srcs;
    std::vector<size_t> sizes;
    for (int k = 1; k < n; ++k) {
      dsts.push_back(dst + k * small), srcs.push_back(peers.slot(k, 0)), sizes.push_back(small);
    }
    cudaMemcpyAttributes attrs{};
    attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t first = 0;
    const double batch = per_call([&] {
      CUDA_CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attrs, &first, 1, copies));
    });
    std::printf("host per call: cudaMemcpyBatchAsync of %d peers' copies %.2f us (%.2f us a copy)\n", n - 1, batch,
                batch / (n - 1));
#endif
  }
  host_barrier(shared, n, round++);
  const auto t0 = std::chrono::steady_clock::now();  // every rank queues the same barriers
  for (int i = 0; i < calls; ++i) peers.barrier(compute);
  const double barrier = ms_since(t0) * 1e3 / calls;
  CUDA_CHECK(cudaStreamSynchronize(compute));
  if (rank == 0) std::printf("host per call: barrier kernel %.2f us\n", barrier);
  host_barrier(shared, n, round++);
}

int run_rank(int rank, int n, size_t chunk_bytes, Shared* shared) {
  CUDA_CHECK(cudaSetDevice(rank));
  const size_t count = chunk_bytes / sizeof(float);
  PeerBuffers peers(rank, n, chunk_bytes * n);
  std::memcpy(shared->handles + rank * PeerBuffers::kHandleBytes, peers.handle().data(), PeerBuffers::kHandleBytes);
  int round = 0;
  host_barrier(shared, n, round++);
  peers.open(std::vector<uint8_t>(shared->handles, shared->handles + n * PeerBuffers::kHandleBytes));
  cudaStream_t compute, copies;
  CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking));
  float* gathered = nullptr;
  CUDA_CHECK(cudaMalloc(&gathered, chunk_bytes * n));
  bool ok = true;

  // 1. six rounds of all-gather then reduce-scatter, the slots alternating
  for (int step = 0; step < 6 && ok; ++step) {
    int s = peers.next_slot();
    fill<<<256, 256, 0, compute>>>(static_cast<float*>(peers.slot(rank, s)), count, static_cast<float>(100 * step + rank));
    peers.barrier(compute);
    for (int k = 0; k < n; ++k)
      PeerBuffers::copy(gathered + k * count, peers.slot(k, s), chunk_bytes, compute);
    CUDA_CHECK(cudaStreamSynchronize(compute));
    for (int k = 0; k < n; ++k) ok = ok && all_equal(gathered + k * count, count, static_cast<float>(100 * step + k));
    s = peers.next_slot();
    float* mine = gathered;  // this rank's contribution to every destination: rank + 1
    fill<<<256, 256, 0, compute>>>(mine, count, static_cast<float>(rank + 1));
    for (int to = 0; to < n; ++to)
      PeerBuffers::copy(static_cast<char*>(peers.slot(to, s)) + rank * chunk_bytes, mine, chunk_bytes, compute);
    peers.barrier(compute);
    CUDA_CHECK(cudaStreamSynchronize(compute));
    const float* received = static_cast<const float*>(peers.slot(rank, s));
    for (int from = 0; from < n; ++from) ok = ok && all_equal(received + from * count, count, static_cast<float>(from + 1));
  }
  if (!ok) shared->failures.fetch_add(1);
  host_barrier(shared, n, round++);
  if (rank == 0)
    std::printf("checks: all-gather (pull) and reduce-scatter (push) over %d GPUs, 6 rounds: %s\n", n,
                shared->failures.load() ? "FAILED" : "ok");

  // 1b. one all-gather in a CUDA graph (slot 0, a barrier after the pulls so that the next
  // replay's fill cannot overwrite what a peer still reads), replayed 4 times, then an eager
  // barrier: every rank counts the same barriers whichever way they ran.
  {
    int* device_round = nullptr;
    CUDA_CHECK(cudaMalloc(&device_round, sizeof(int)));
    CUDA_CHECK(cudaMemset(device_round, 0, sizeof(int)));
    CUDA_CHECK(cudaStreamSynchronize(compute));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal));
    next_round<<<1, 1, 0, compute>>>(device_round);
    fill_round<<<256, 256, 0, compute>>>(static_cast<float*>(peers.slot(rank, 0)), count, device_round, rank);
    peers.barrier(compute);
    for (int k = 0; k < n; ++k) PeerBuffers::copy(gathered + k * count, peers.slot(k, 0), chunk_bytes, compute);
    peers.barrier(compute);
    CUDA_CHECK(cudaStreamEndCapture(compute, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    bool graph_ok = true;
    for (int replay = 1; replay <= 4; ++replay) {
      CUDA_CHECK(cudaGraphLaunch(exec, compute));
      CUDA_CHECK(cudaStreamSynchronize(compute));
      for (int k = 0; k < n; ++k) graph_ok = graph_ok && all_equal(gathered + k * count, count, static_cast<float>(1000 * replay + k));
    }
    peers.barrier(compute);  // eager again, after the replays
    CUDA_CHECK(cudaStreamSynchronize(compute));
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    CUDA_CHECK(cudaFree(device_round));
    if (!graph_ok) shared->failures.fetch_add(1);
    host_barrier(shared, n, round++);
    if (rank == 0)
      std::printf("checks: the all-gather in a CUDA graph, 4 replays between eager barriers: %s\n",
                  shared->failures.load() ? "FAILED" : "ok");
  }

  // 1c. timed barriers: the last rank arrives 2 ms late (a spinning kernel before its barrier); every
  // other rank's timed wait total grows by about that, the last rank's by little (what the engine's
  // progress line reports as the GPU's wait for the other ranks, without a profiler).
  {
    const auto before = peers.timed_waits();
    const long long late_ns = 2000000;
    host_barrier(shared, n, round++);
    if (rank == n - 1) spin<<<1, 1, 0, compute>>>(late_ns);
    peers.barrier(compute, /*timed=*/true);
    CUDA_CHECK(cudaStreamSynchronize(compute));
    const auto after = peers.timed_waits();
    const uint64_t waited_ns = after.total_ns - before.total_ns;
    const double waited_ms = static_cast<double>(waited_ns) / 1e6;
    // and the barrier's own entry in the ring of timed waits (ME_TP_BARRIER_LOG) holds the same time
    const bool logged = after.count == before.count + 1 &&
                        after.ring[before.count % me::kernels::PeerBuffers::kWaitLog] == waited_ns;
    const bool timed_ok = logged && (rank == n - 1 ? waited_ms < 0.5 : waited_ms > 1.6 && waited_ms < 3.0);
    if (!timed_ok) shared->failures.fetch_add(1);
    std::printf("checks: timed barrier, rank %d waited %.3f ms (%s)\n", rank, waited_ms,
                rank == n - 1 ? "the late one: expected < 0.5" : "expected about 2");
    host_barrier(shared, n, round++);
    if (rank == 0)
      std::printf("checks: timed barriers count each rank's wait for the last one: %s\n",
                  shared->failures.load() ? "FAILED" : "ok");
  }

  // 1d. arrival signals: 4 rounds of push + signal, wait, read, the last rank late in each
  {
    bool signals_ok = true;
    cudaStream_t signals;
    cudaEvent_t filled;
    CUDA_CHECK(cudaStreamCreateWithFlags(&signals, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming));
    float* mine = gathered + (n - 1) * count;  // this rank's pushed value, away from what is read back
    for (int step = 0; step < 4; ++step) {
      const int s = peers.next_slot();
      host_barrier(shared, n, round++);
      const float value = static_cast<float>(10000 + 100 * step + rank);
      fill<<<256, 256, 0, copies>>>(mine, count, value);
      if (rank == n - 1) spin<<<1, 1, 0, copies>>>(2000000);
      for (int k = 1; k < n; ++k) {
        const int to = (rank + k) % n;
        PeerBuffers::copy(static_cast<char*>(peers.slot(to, s)) + rank * chunk_bytes, mine, chunk_bytes, copies);
        peers.signal_arrival(to, copies);
      }
      peers.wait_arrivals(compute, /*timed=*/true);
      for (int k = 1; k < n; ++k) {  // read on the compute stream, as the sum does
        const int from = (rank + k) % n;
        PeerBuffers::copy(gathered + (k - 1) * count, static_cast<char*>(peers.slot(rank, s)) + from * chunk_bytes,
                          chunk_bytes, compute);
      }
      CUDA_CHECK(cudaStreamSynchronize(compute));
      for (int k = 1; k < n; ++k)
        signals_ok = signals_ok && all_equal(gathered + (k - 1) * count, count,
                                             static_cast<float>(10000 + 100 * step + (rank + k) % n));
      CUDA_CHECK(cudaStreamSynchronize(copies));
      // and an all-gather by publication signals (ME_TP_AG_SIGNALS): this rank's rows into its own
      // slot (the last rank 2 ms late), a signal to each peer, each pull after its peer's signal only
      // As the engine orders them: the fill on the compute stream, an event, the signals on a
      // stream of their own that waits for it (no host sync between: a signal ahead of the fill
      // would let a peer pull stale values), the waits and pulls on the copy stream.
      const int g = peers.next_slot();
      host_barrier(shared, n, round++);
      if (rank == n - 1) spin<<<1, 1, 0, compute>>>(2000000);
      fill<<<256, 256, 0, compute>>>(static_cast<float*>(peers.slot(rank, g)), count, value + 0.5f);
      CUDA_CHECK(cudaEventRecord(filled, compute));
      CUDA_CHECK(cudaStreamWaitEvent(signals, filled, 0));
      for (int k = 1; k < n; ++k) peers.signal_published((rank + k) % n, signals);
      CUDA_CHECK(cudaEventRecord(filled, signals));  // (re-recorded: the wait above took the first)
      CUDA_CHECK(cudaStreamWaitEvent(copies, filled, 0));  // the pulls after this rank's own signals
      for (int k = 1; k < n; ++k) {
        const int from = (rank + k) % n;
        peers.wait_published(from, copies);
        PeerBuffers::copy(gathered + (k - 1) * count, peers.slot(from, g), chunk_bytes, copies);
      }
      CUDA_CHECK(cudaStreamSynchronize(copies));
      CUDA_CHECK(cudaStreamSynchronize(signals));
      for (int k = 1; k < n; ++k)
        signals_ok = signals_ok && all_equal(gathered + (k - 1) * count, count,
                                             static_cast<float>(10000 + 100 * step + (rank + k) % n) + 0.5f);
    }
    CUDA_CHECK(cudaEventDestroy(filled));
    CUDA_CHECK(cudaStreamDestroy(signals));
    if (!signals_ok) shared->failures.fetch_add(1);
    host_barrier(shared, n, round++);
    if (rank == 0)
      std::printf("checks: arrival and publication signals (the last rank 2 ms late), 4 rounds: %s\n",
                  shared->failures.load() ? "FAILED" : "ok");
  }

  // 2. bandwidth: rank 0 pulls one peer's chunk, then every peer's at once (a stream each)
  const int iters = 20;
  if (rank == 0 && n > 1) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) PeerBuffers::copy(gathered, peers.slot(1, 0), chunk_bytes, copies);
    CUDA_CHECK(cudaStreamSynchronize(copies));
    const double one = ms_since(t0) / iters;
    std::vector<cudaStream_t> streams(n);
    for (auto& st : streams) CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i)
      for (int k = 1; k < n; ++k) PeerBuffers::copy(gathered + k * count, peers.slot(k, 0), chunk_bytes, streams[k]);
    for (int k = 1; k < n; ++k) CUDA_CHECK(cudaStreamSynchronize(streams[k]));
    const double all = ms_since(t0) / iters;
    std::printf("copy engines: %.1f MiB from one peer %.1f us (%.0f GB/s); from %d peers at once %.1f us (%.0f GB/s in)\n",
                chunk_bytes / 1048576.0, one * 1e3, chunk_bytes / one / 1e6, n - 1, all * 1e3,
                chunk_bytes * (n - 1) / all / 1e6);
    for (auto& st : streams) CUDA_CHECK(cudaStreamDestroy(st));
  }
  host_barrier(shared, n, round++);

  // 2b. every rank at once, as a training step's all-gather runs: each pulls every peer's chunk
  // (into its result, one stream as the engine does, then a stream per peer), or pushes its own
  // chunk into every peer's slot (its place in slot 1; one stream, then a stream per peer).
  // Pulls are reads over NVLink, pushes writes: which way moves more, with every GPU both
  // sending and receiving, decides how the engine's all-gather should move its rows.
  if (n > 1) {
    std::vector<cudaStream_t> streams(n);
    for (auto& st : streams) CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    auto exchange = [&](int pattern) {
      const bool push = pattern >= 2, spread = pattern % 2 == 1;
      for (int k = 1; k < n; ++k) {
        const int peer = (rank + k) % n;
        cudaStream_t st = spread ? streams[k] : copies;
        if (push)
          PeerBuffers::copy(static_cast<char*>(peers.slot(peer, 1)) + rank * chunk_bytes, peers.slot(rank, 0),
                            chunk_bytes, st);
        else
          PeerBuffers::copy(gathered + peer * count, peers.slot(peer, 0), chunk_bytes, st);
      }
    };
    for (int pattern = 0; pattern < 4; ++pattern) {
      exchange(pattern);  // warm-up
      CUDA_CHECK(cudaDeviceSynchronize());
      host_barrier(shared, n, round++);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) exchange(pattern);
      CUDA_CHECK(cudaDeviceSynchronize());
      shared->us[pattern][rank] = ms_since(t0) * 1e3 / iters;
      host_barrier(shared, n, round++);
    }
    if (rank == 0) {
      const char* names[4] = {"pull, one stream", "pull, a stream per peer", "push, one stream",
                              "push, a stream per peer"};
      for (int pattern = 0; pattern < 4; ++pattern) {
        double slowest = 0;
        for (int r = 0; r < n; ++r) slowest = std::max(slowest, shared->us[pattern][r]);
        std::printf("every rank at once, %d peers' %.1f MiB each, %-24s: slowest rank %.1f us (%.0f GB/s in a GPU)\n",
                    n - 1, chunk_bytes / 1048576.0, names[pattern], slowest,
                    chunk_bytes * (n - 1) / slowest / 1e3);
      }
    }
    for (auto& st : streams) CUDA_CHECK(cudaStreamDestroy(st));
  }
  host_barrier(shared, n, round++);

  // 3. a GEMM alone, then beside the pulls (rank 0's GEMM; the others idle, their regions read)
  if (rank == 0 && n > 1) {
    cublasHandle_t blas;
    cublasCreate(&blas);
    cublasSetStream(blas, compute);
    const int m = 8192;
    __nv_bfloat16 *a, *b, *c;
    CUDA_CHECK(cudaMalloc(&a, sizeof(__nv_bfloat16) * m * m));
    CUDA_CHECK(cudaMalloc(&b, sizeof(__nv_bfloat16) * m * m));
    CUDA_CHECK(cudaMalloc(&c, sizeof(__nv_bfloat16) * m * m));
    CUDA_CHECK(cudaMemset(a, 0, sizeof(__nv_bfloat16) * m * m));
    CUDA_CHECK(cudaMemset(b, 0, sizeof(__nv_bfloat16) * m * m));
    const float one = 1, zero = 0;
    auto gemm = [&] {
      cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, a, CUDA_R_16BF, m, b, CUDA_R_16BF, m, &zero, c,
                   CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    for (int i = 0; i < 3; ++i) gemm();
    CUDA_CHECK(cudaStreamSynchronize(compute));
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) gemm();
    CUDA_CHECK(cudaStreamSynchronize(compute));
    const double alone = ms_since(t0) / iters;
    int pulls = 0;
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) gemm();
    while (cudaStreamQuery(compute) == cudaErrorNotReady) {  // keep the copy engines busy meanwhile
      for (int k = 1; k < n; ++k, ++pulls) PeerBuffers::copy(gathered + k * count, peers.slot(k, 0), chunk_bytes, copies);
      CUDA_CHECK(cudaStreamSynchronize(copies));
    }
    const double beside = ms_since(t0) / iters;
    std::printf("GEMM 8192^3 bf16: %.3f ms alone (%.0f TFLOP/s), %.3f ms beside copy-engine pulls (%.3fx; %d pulls of %.1f MiB)\n",
                alone, 2.0 * m * m * m / alone / 1e9, beside, beside / alone, pulls, chunk_bytes / 1048576.0);
    // 3b. a local copy (this GPU to itself, as an all-gather's own rows) queued beside the GEMM:
    // when it ends, counted from the GEMM's start. On the multiprocessors it waits for the GEMM's
    // last wave; on a copy engine it ends about a copy's time after the start.
    {
      cudaEvent_t started, copied, gemm_done;
      CUDA_CHECK(cudaEventCreate(&started));
      CUDA_CHECK(cudaEventCreate(&copied));
      CUDA_CHECK(cudaEventCreate(&gemm_done));
      auto beside_gemm = [&](const std::function<void()>& issue_copy) {
        double copy_us = 0, gemm_us = 0;
        for (int i = 0; i < 5; ++i) {
          CUDA_CHECK(cudaEventRecord(started, compute));
          CUDA_CHECK(cudaStreamWaitEvent(copies, started, 0));
          gemm();
          CUDA_CHECK(cudaEventRecord(gemm_done, compute));
          issue_copy();
          CUDA_CHECK(cudaEventRecord(copied, copies));
          CUDA_CHECK(cudaDeviceSynchronize());
          float ms = 0;
          CUDA_CHECK(cudaEventElapsedTime(&ms, started, copied));
          copy_us += ms * 1e3 / 5;
          CUDA_CHECK(cudaEventElapsedTime(&ms, started, gemm_done));
          gemm_us += ms * 1e3 / 5;
        }
        return std::make_pair(copy_us, gemm_us);
      };
      const auto plain = beside_gemm([&] { PeerBuffers::copy(gathered, gathered + count, chunk_bytes, copies); });
      std::printf("local copy of %.1f MiB beside a %.0f us GEMM ends, from the GEMM's start: cudaMemcpyAsync %.0f us",
                  chunk_bytes / 1048576.0, plain.second, plain.first);
#if CUDART_VERSION >= 13000
      // the driver asked for a copy engine (session 26, H200: ignored, 1309 us against 1310)
      const auto hinted = beside_gemm([&] {
        cudaMemcpyAttributes attrs{};
        attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        attrs.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        size_t first = 0;
        void* dsts[] = {gathered};
        const void* srcs[] = {gathered + count};
        size_t sizes[] = {chunk_bytes};
        CUDA_CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &attrs, &first, 1, copies));
      });
      std::printf(", cudaMemcpyBatchAsync with cudaMemcpyFlagPreferOverlapWithCompute %.0f us", hinted.first);
#endif
      std::printf(" (about a copy's time: a copy engine; about the GEMM's: the multiprocessors)\n");
      cudaEventDestroy(started), cudaEventDestroy(copied), cudaEventDestroy(gemm_done);
    }
    cudaFree(a), cudaFree(b), cudaFree(c);
    cublasDestroy(blas);
  }
  host_barrier(shared, n, round++);
  host_calls(rank, n, peers, gathered, compute, copies, shared, round);
  cudaFree(gathered);
  return shared->failures.load() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The parent touches no CUDA (a child forked after CUDA's initialisation cannot use it): a
  // forked probe counts the GPUs.
  const pid_t probe = fork();
  if (probe == 0) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    std::_Exit(count);
  }
  int probe_status = 0;
  waitpid(probe, &probe_status, 0);
  const int gpus = WIFEXITED(probe_status) ? WEXITSTATUS(probe_status) : 0;
  if (gpus == 0) {
    std::printf("no CUDA GPU here: skipped (run it on the GPU machine)\n");
    return 77;
  }
  const int n = argc > 1 ? std::atoi(argv[1]) : gpus;
  const size_t mib = argc > 2 ? static_cast<size_t>(std::atoi(argv[2])) : 16;
  if (n < 2 || n > gpus || n > 32) {
    std::printf("needs 2 to %d GPUs, got %d: skipped\n", gpus < 32 ? gpus : 32, n);
    return 77;
  }
  auto* shared = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (shared) Shared{};
  std::vector<pid_t> children;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {  // _Exit skips stdio's flush: a redirected stdout would lose the rank's lines
      const int rc = run_rank(r, n, mib << 20, shared);
      std::fflush(stdout);
      std::_Exit(rc);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  std::printf("peer_buffers: %s\n", failed ? "FAILED" : "all checks passed");
  return failed;
}
