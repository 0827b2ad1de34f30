// Sequence-parallel collectives overlapped with the GEMMs beside them, chunk by chunk (what
// Megatron calls --tp-comm-overlap): the collective runs on a side stream while the GEMM works
// on the rows it does not need. Rows are tokens: under sequence parallelism rank r holds the
// r-th of tp consecutive chunks of a [batch x seq] tensor's rows (parallel/mappings.h).
//
// With the group's peer buffers (TensorParallel::peers, parallel.tp_comm_backend = "copy_engine")
// the all-gathers and reduce-scatters are copies between the GPUs' memories on the copy engines
// instead of NCCL kernels, so the GEMMs beside them keep every multiprocessor.
//
// On the CPU the collectives run in line (same results, no overlap): the tests there cover the
// chunking itself.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <vector>

#include "engine/parallel/tensor_parallel.h"

namespace me::parallel {

// Queues `collective` on this GPU's tensor-parallel side stream after everything queued so far
// on the current stream, so that what the caller queues next overlaps it; the returned function
// orders the current stream after it. `uses`: the current stream's tensors the collective reads
// or writes (kept from the allocator until the side stream is done with them); `produced`: a
// tensor the collective allocates, handed back to the current stream. On the CPU it runs at once.
std::function<void()> start_collective(const std::vector<torch::Tensor>& uses, const std::function<void()>& collective,
                                       torch::Tensor* produced = nullptr);

// While it lives, the GEMMs this thread queues on the current GPU target all but
// tp.comm_sm_margin multiprocessors (parallel.tp_comm_sm_margin): a GEMM whose persistent blocks
// fill every SM would otherwise make the collective beside it wait, and the two would run one
// after the other. It sets LibTorch's cuBLAS handle for this thread, our cuBLASLt GEMMs, and
// LibTorch's own SM carve-out, which is process-wide (the engine drives each GPU from one
// thread). No effect on the CPU or with a margin of 0.
class SmMarginForCollective {
 public:
  SmMarginForCollective(const torch::Tensor& on, const TensorParallel& tp);  // tp.comm_sm_margin
  SmMarginForCollective(const torch::Tensor& on, int margin);                 // `margin` SMs left free
  ~SmMarginForCollective();
  SmMarginForCollective(const SmMarginForCollective&) = delete;
  SmMarginForCollective& operator=(const SmMarginForCollective&) = delete;

 private:
  void* handle_ = nullptr;  // the cuBLAS handle whose SM target was changed, and its previous one
  int previous_ = 0;
};

// Computes output rows [first, first + in.size(0)) from input rows `in` (2-D), writing them
// into an output the caller owns.
using RowsInto = std::function<void(const torch::Tensor& in, int64_t first)>;

// All-gathers this rank's chunk `local` ([b, s / tp, ...]) into [b, s, ...], which it returns,
// and calls rows() on every chunk of it: on this rank's own while the others arrive, then on
// each peer's as soon as it is in (the copy engines; NCCL with TensorParallel::gather_ring), or
// else on the rows before it and the rows after it once all are. out_cols: the columns rows()
// computes per row (the GEMM's N; 0 if not known): on the copy engines, a GEMM wide enough to
// outlast every pull takes all the peers' rows at once (fuller waves) instead of one peer's.
torch::Tensor all_gather_rows(const torch::Tensor& local, const TensorParallel& tp, const RowsInto& rows,
                              int64_t out_cols = 0);

// The peers' rows of the copy engines' all-gather in the order they are pulled (rank + 1,
// rank + 2, ... around the ring), as runs of at most `group` peers whose rows are contiguous (a
// run stops at the wrap to rank 0): each run is one GEMM, once its last pull (the k-th, k from 1)
// has landed.
struct PeerRun {
  int first = 0, count = 0, last_pull = 0;
};
std::vector<PeerRun> peer_runs(int rank, int size, int group);

// peer_runs' group for a GEMM of out_cols output columns (0: not known) at `size` ranks: every
// peer's rows in one GEMM (two where the peers' rows wrap past rank 0) where the GEMM of this
// rank's own rows outlasts the pulls of all the others', else each peer's rows as they land.
// ME_TP_GATHER_GROUP=N, when set, fixes it at N (an experiment; 1: each peer's rows).
int gather_group_for(int64_t out_cols, int size);

// All-gathers `local` ([b, s / tp, ...]) into [b, s, ...], which it returns, while beside()
// runs on the current stream (backward's held weight-gradient GEMM: DelayedWeightGrad): on the
// copy engines, or NCCL on the side stream; on the CPU the gather first.
torch::Tensor all_gather_beside(const torch::Tensor& local, const TensorParallel& tp, const std::function<void()>& beside);

// Returns this rank's chunk ([chunk_rows, cols]) of the sum over ranks of a [tp x chunk_rows,
// cols] partial result whose rows partial(first, n) computes (a new 2-D tensor): each other
// rank's rows first, each sent to that rank as soon as it is computed (ring order, so every pair
// of ranks meets at the same step), this rank's own rows last, then the received partials added,
// then `bias` ([cols]; a row-parallel layer's), if given, in the same pass on the copy engines.
torch::Tensor reduce_scatter_rows(int64_t chunk_rows, const TensorParallel& tp,
                                  const std::function<torch::Tensor(int64_t first, int64_t n)>& partial,
                                  const torch::Tensor& bias = {});

// Starts the reduce-scatter of `full` ([tp x chunk rows, ...], this rank's partial sums) over
// the copy engines when the group has peer buffers and the tensor fits them, and returns the
// function that finishes it (this rank's chunk of the sum); else returns nothing and the caller
// reduces as before. What the caller queues between the two overlaps the copies.
std::function<torch::Tensor()> start_peer_reduce_scatter(const torch::Tensor& full, const TensorParallel& tp);

}  // namespace me::parallel
