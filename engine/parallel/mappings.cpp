#include "engine/parallel/mappings.h"

#include "engine/core/autograd_state.h"
#include "engine/core/error.h"

namespace me::parallel {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// The group outlives every graph built over it: backward finds it in saved_data.
comm::ProcessGroup& group_of(AutogradContext* ctx) { return *saved_state<comm::ProcessGroup*>(ctx, "group"); }

torch::Tensor all_reduce(const torch::Tensor& x, comm::ProcessGroup& g) {
  auto y = x.contiguous().clone();
  g.all_reduce(y, comm::ReduceOp::sum);
  return y;
}

// Each mapping: forward and backward as two of the collectives below.
enum class Op { identity, all_reduce, gather_last, slice_last, gather_seq, slice_seq, reduce_scatter_seq };

torch::Tensor apply(Op op, const torch::Tensor& x, comm::ProcessGroup& g) {
  switch (op) {
    case Op::identity: return x;
    case Op::all_reduce: return all_reduce(x, g);
    case Op::gather_last: return all_gather_dim(x, x.dim() - 1, g);
    case Op::slice_last: return slice_dim(x, x.dim() - 1, g.rank(), g.size());
    case Op::gather_seq: return all_gather_tokens(x, g);
    case Op::slice_seq: return slice_tokens(x, g.rank(), g.size());
    case Op::reduce_scatter_seq: return reduce_scatter_tokens(x, g);
  }
  return x;
}

template <Op Forward, Op Backward>
struct Mapping : public torch::autograd::Function<Mapping<Forward, Backward>> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, comm::ProcessGroup* group) {
    save_state(ctx, "group", group);
    return apply(Forward, x, group_of(ctx));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {apply(Backward, grads[0], group_of(ctx)), torch::Tensor()};
  }
};

template <Op F, Op B>
torch::Tensor map(const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.active()) return x;
  return Mapping<F, B>::apply(x, tp.group);
}

// x as [outer, n, inner] around dimension `dim` (a view: x is contiguous).
struct AroundDim {
  int64_t outer = 1, n = 0, inner = 1;
  AroundDim(const torch::Tensor& x, int64_t dim) : n(x.size(dim)) {
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  }
};
}  // namespace

// The collectives concatenate and split along dimension 0 of a buffer of size() chunks. This
// rank's [outer, n, inner] is already such a chunk; gathered, the chunks sit [size, outer, n,
// inner] and one permuting copy puts them in place as [outer, size * n, inner] (none at all
// when outer is 1, as for a batch of one).
torch::Tensor all_gather_dim(const torch::Tensor& x, int64_t dim, comm::ProcessGroup& g) {
  auto in = x.contiguous();
  const AroundDim a(in, dim);
  auto out = torch::empty({g.size(), a.outer, a.n, a.inner}, in.options());
  g.all_gather(out, in);
  auto sizes = in.sizes().vec();
  sizes[static_cast<size_t>(dim)] *= g.size();
  return out.permute({1, 0, 2, 3}).contiguous().view(sizes);
}

void check_tokens_split(const torch::Tensor& x, int64_t parts, const char* what) {
  ME_CHECK(x.dim() >= 2 && x.size(1) % parts == 0, what, ": sequence parallelism splits a [batch, seq, ...] tensor's ",
           "tokens into ", parts, " equal chunks, which needs seq % tp == 0; got shape ", x.sizes());
}

// Gathered rank after rank, the chunks are the tokens in their natural order: the buffer is the result.
torch::Tensor all_gather_tokens(const torch::Tensor& x, comm::ProcessGroup& g) {
  ME_CHECK(x.dim() >= 2, "sequence-parallel all-gather: expected [batch, seq / tp, ...], got shape ", x.sizes());
  auto in = x.contiguous();
  auto out = torch::empty(gathered_tokens_shape(in, g.size()), in.options());
  g.all_gather(out, in);
  return out;
}

std::vector<int64_t> gathered_tokens_shape(const torch::Tensor& x, int64_t parts) {
  auto sizes = x.sizes().vec();
  sizes[1] *= parts;
  return sizes;
}

torch::Tensor reduce_scatter_tokens(const torch::Tensor& x, comm::ProcessGroup& g) {
  check_tokens_split(x, g.size(), "sequence-parallel reduce-scatter");
  auto in = x.contiguous();
  auto sizes = in.sizes().vec();
  sizes[1] /= g.size();
  auto out = torch::empty(sizes, in.options());
  g.reduce_scatter(out, in, comm::ReduceOp::sum);
  return out;
}

torch::Tensor slice_tokens(const torch::Tensor& x, int rank, int size) {
  check_tokens_split(x, size, "sequence-parallel split");
  auto sizes = x.sizes().vec();
  sizes[1] /= size;
  const int64_t chunk = x.numel() / size;
  return x.contiguous().view({-1}).narrow(0, rank * chunk, chunk).view(sizes);
}

torch::Tensor slice_dim(const torch::Tensor& x, int64_t dim, int rank, int size) {
  ME_CHECK(x.size(dim) % size == 0, "cannot split dimension ", dim, " of size ", x.size(dim), " into ", size,
           " equal parts");
  const int64_t part = x.size(dim) / size;
  return x.narrow(dim, rank * part, part).contiguous();
}

torch::Tensor copy_to_tp(const torch::Tensor& x, const TensorParallel& tp) { return map<Op::identity, Op::all_reduce>(x, tp); }
torch::Tensor reduce_from_tp(const torch::Tensor& x, const TensorParallel& tp) { return map<Op::all_reduce, Op::identity>(x, tp); }
torch::Tensor scatter_last(const torch::Tensor& x, const TensorParallel& tp) { return map<Op::slice_last, Op::gather_last>(x, tp); }
torch::Tensor gather_last(const torch::Tensor& x, const TensorParallel& tp) { return map<Op::gather_last, Op::slice_last>(x, tp); }
torch::Tensor scatter_seq(const torch::Tensor& x, const TensorParallel& tp) { return map<Op::slice_seq, Op::gather_seq>(x, tp); }
torch::Tensor gather_seq(const torch::Tensor& x, const TensorParallel& tp) { return map<Op::gather_seq, Op::reduce_scatter_seq>(x, tp); }
torch::Tensor reduce_scatter_seq(const torch::Tensor& x, const TensorParallel& tp) { return map<Op::reduce_scatter_seq, Op::gather_seq>(x, tp); }
torch::Tensor gather_seq_plain(const torch::Tensor& x, const TensorParallel& tp) { return map<Op::gather_seq, Op::slice_seq>(x, tp); }

}  // namespace me::parallel
