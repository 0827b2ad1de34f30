// The tensor-parallel setting a layer is built with: the group its shards talk over (none
// means tp = 1: every mapping is the identity) and whether activations outside the
// tensor-parallel regions are split over the tokens (sequence parallelism, parallel/mappings.h).
#pragma once
#include "engine/comm/process_group.h"

namespace me::kernels {
class PeerBuffers;  // kernels/peer_buffers.h
}

namespace me::parallel {

class SymmetricSlots;  // parallel/symmetric_slots.h

struct TensorParallel {
  comm::ProcessGroup* group = nullptr;  // not owned; outlives the model
  bool sequence_parallel = false;
  // TP collectives on a side stream, overlapped with the GEMMs beside them (parallel::linear):
  // column-parallel layers' input-gradient reduction with the weight-gradient GEMM, and under
  // sequence parallelism the all-gathers and reduce-scatters chunk by chunk with the GEMMs that
  // consume or produce them (parallel/collective_matmul.h). false: in line, for A/B comparisons.
  bool overlap_comm = true;
  // Multiprocessors the GEMMs leave free while a collective runs beside them (0: none), so that
  // the collective's kernels need not wait for the GEMM's persistent blocks (SmMarginForCollective).
  int comm_sm_margin = 0;
  // NCCL's overlapped sequence-parallel all-gather as a ring of exchanges whose rows are
  // multiplied as they arrive (parallel.tp_gather = "ring"); false: one collective beside the
  // GEMM of this rank's rows (collective_matmul.h).
  bool gather_ring = false;
  // Under sequence parallelism with the overlap, backward's all-gathers and reduce-scatters run
  // beside the weight-gradient GEMM of the layer before, held until then (DelayedWeightGrad,
  // parallel.tp_delay_wgrad); false: the all-gathers beside the split input-gradient GEMM.
  bool delay_wgrad = true;
  // Registered buffers the overlapped sequence-parallel all-gathers fill in place (NCCL's
  // symmetric kernels; parallel.tp_symmetric_mb); null: ordinary memory. Not owned.
  SymmetricSlots* slots = nullptr;
  // The group's peer-mapped buffers (parallel.tp_comm_backend = "copy_engine"): the overlapped
  // sequence-parallel all-gathers and reduce-scatters then run on the copy engines
  // (collective_matmul.h); null: NCCL. Not owned.
  kernels::PeerBuffers* peers = nullptr;

  int size() const { return group ? group->size() : 1; }
  int rank() const { return group ? group->rank() : 0; }
  bool active() const { return size() > 1; }
};

}  // namespace me::parallel
