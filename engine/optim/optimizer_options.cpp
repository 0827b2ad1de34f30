#include "engine/optim/optimizer_options.h"

#include "engine/core/error.h"

namespace me::optim {

void OptimizerOptions::check() const {
  ME_CHECK(kind == "adamw" || kind == "sgd", "optimizer.kind '", kind, "': expected adamw or sgd");
  ME_CHECK(lr > 0, "optimizer.lr must be positive, got ", lr);
  ME_CHECK(clip >= 0, "optimizer.clip must be >= 0 (0 turns clipping off), got ", clip);
  ME_CHECK(weight_decay >= 0, "optimizer.weight_decay must be >= 0, got ", weight_decay);
  if (kind == "adamw") {
    ME_CHECK(betas[0] >= 0 && betas[0] < 1, "optimizer.betas[1] must be in [0, 1), got ", betas[0]);
    ME_CHECK(betas[1] >= 0 && betas[1] < 1, "optimizer.betas[2] must be in [0, 1), got ", betas[1]);
    ME_CHECK(eps > 0, "optimizer.eps must be positive, got ", eps);
  }
}

}  // namespace me::optim
