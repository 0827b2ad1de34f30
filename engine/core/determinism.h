// train.deterministic: the same run gives the same bits, on the GPU too, and a resumed run the
// same bits as the uninterrupted one. What it takes, all set in this process before the run's
// first GPU work:
// - LibTorch's deterministic algorithms, as a tripwire: an op without a deterministic
//   implementation (index_add_ and scatter_add_ on CUDA, ...) throws instead of running, so a
//   new op on the training path fails a test rather than a reproduction; without its NaN fill
//   of every new tensor (LibTorch >= 2.1), a kernel per allocation;
// - cuBLAS with a fixed workspace per stream (CUBLAS_WORKSPACE_CONFIG=:4096:8), so the GEMMs on
//   the side streams of the overlapped collectives pick the same algorithms every run;
//   cuDNN's deterministic algorithms and no benchmarking;
// - NCCL with a fixed algorithm and protocol (NCCL_ALGO=Ring, NCCL_PROTO=Simple unless the
//   environment fixes them already), so every reduction sums in the same order;
// - our cuBLASLt GEMMs with the heuristic's first algorithm, not the fastest of its candidates
//   by timing (ME_GEMM_AUTOTUNE=1 is refused, 0 set), which can differ from run to run;
// - FlashAttention for attention (ME_ATTENTION=flash unless set): its backward then runs its
//   deterministic path (cuDNN's attention backward has none); where heads are not grouped the
//   forward is cuDNN's, which is deterministic and faster (compat::CudnnForwardFlashBackward).
// Our own kernels (engine/kernels) reduce in a fixed order without atomics in any mode, and the
// data order is the seed's; tests/unit/test_kernels.cpp checks both kernels and model in this
// mode.
#pragma once
#include <string>

namespace me {

// Applies the settings above; returns them as one line for the log ("LibTorch deterministic
// algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8, ..."). Idempotent. Throws me::Error when the
// environment asks for something that cannot be deterministic (ME_ATTENTION=cudnn).
std::string apply_deterministic_mode();

// Whether apply_deterministic_mode ran in this process.
bool deterministic_mode();

}  // namespace me
