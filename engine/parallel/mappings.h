// The communication of tensor and sequence parallelism, each a small autograd function whose
// backward is the matching collective (Megatron-Core's mappings.py). Activations are
// [batch, seq, hidden]: "last" means the hidden dimension.
//
// Sequence parallelism splits the tokens: the [batch, seq] tokens, in their natural order, cut
// into tp consecutive chunks, rank r holding chunk r as [batch, seq / tp, hidden] (for a batch
// of one, a slice of the sequence, as in Megatron). Every operation between the collectives works
// token by token, so which tokens a rank holds does not matter, only that all agree; and with
// consecutive chunks the gathered tensor is the collective's buffer as it is, while the
// reduce-scatter's chunks are the input as it is: no permuting copies (Megatron gets the same from
// its [seq, batch, hidden] layout).
#pragma once
#include <torch/torch.h>

#include "engine/parallel/tensor_parallel.h"

namespace me::parallel {

// Entering a column-parallel region: forward identity, backward all-reduce.
torch::Tensor copy_to_tp(const torch::Tensor& x, const TensorParallel& tp);
// Leaving a row-parallel region: forward all-reduce, backward identity.
torch::Tensor reduce_from_tp(const torch::Tensor& x, const TensorParallel& tp);
// Keep this rank's slice of the last dimension; backward all-gathers it.
torch::Tensor scatter_last(const torch::Tensor& x, const TensorParallel& tp);
// All-gather along the last dimension; backward keeps this rank's slice.
torch::Tensor gather_last(const torch::Tensor& x, const TensorParallel& tp);
// Sequence parallelism: keep this rank's chunk of the tokens; backward all-gathers.
torch::Tensor scatter_seq(const torch::Tensor& x, const TensorParallel& tp);
// All-gather the sequence before a column-parallel layer; backward reduce-scatters (the
// gradient flowing back is a partial sum from each rank's column shard).
torch::Tensor gather_seq(const torch::Tensor& x, const TensorParallel& tp);
// After a row-parallel layer under sequence parallelism: reduce-scatter the tokens; backward
// all-gathers.
torch::Tensor reduce_scatter_seq(const torch::Tensor& x, const TensorParallel& tp);
// All-gather the sequence where the result is not followed by a TP layer (the final logits
// path in tests): backward keeps this rank's slice.
torch::Tensor gather_seq_plain(const torch::Tensor& x, const TensorParallel& tp);

// Collective building blocks without autograd. The sequence-parallel ones on [batch, seq, ...]
// tensors: [b, s / tp, ...] chunks to [b, s, ...] and back.
torch::Tensor all_gather_tokens(const torch::Tensor& x, comm::ProcessGroup& g);
// x's shape with its tokens (dimension 1) from `parts` ranks: [b, s * parts, ...].
std::vector<int64_t> gathered_tokens_shape(const torch::Tensor& x, int64_t parts);
torch::Tensor reduce_scatter_tokens(const torch::Tensor& x, comm::ProcessGroup& g);
torch::Tensor slice_tokens(const torch::Tensor& x, int rank, int size);
// Throws, naming `what`, unless x is [batch, seq, ...] with seq divisible into `parts`.
void check_tokens_split(const torch::Tensor& x, int64_t parts, const char* what);
torch::Tensor all_gather_dim(const torch::Tensor& x, int64_t dim, comm::ProcessGroup& g);
torch::Tensor slice_dim(const torch::Tensor& x, int64_t dim, int rank, int size);

}  // namespace me::parallel
