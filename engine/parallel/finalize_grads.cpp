#include "engine/parallel/finalize_grads.h"

namespace me::parallel {

void finalize_grads(GradBuffer& grads, const SharedGradients& shared, double loss_scale) {
  grads.finish([&] {
    if (shared.tied_embedding < 0 || !shared.embedding_group) return;
    auto g = grads.view(static_cast<size_t>(shared.tied_embedding));
    shared.embedding_group->all_reduce(g, comm::ReduceOp::sum);
  });
  if (shared.tp_group)
    for (size_t i : shared.sequence_parallel)
      for (auto& piece : grads.reduced_views(i)) shared.tp_group->all_reduce(piece, comm::ReduceOp::sum);
  if (loss_scale != 1.0) grads.flat().div_(loss_scale);  // unscaled before the norm and the update
}

}  // namespace me::parallel
