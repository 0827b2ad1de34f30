// The optimizer's options: the recipe's `optimizer` section, owned here and composed by the
// recipe (engine/config/recipe.h). The defaults are AdamW's in bindings/lua/fields.lua, which
// has each field's help (tests/unit/test_recipe_fields.cpp checks that they agree). No LibTorch.
#pragma once
#include <array>
#include <string>
#include <type_traits>

namespace me::optim {

struct OptimizerOptions {
  std::string kind = "adamw";  // adamw | sgd
  double lr = 1e-3;            // the peak learning rate (the schedule's maximum)
  std::array<double, 2> betas{0.9, 0.95};  // AdamW's beta1, beta2
  double eps = 1e-8;           // AdamW
  double weight_decay = 0.1;   // decoupled (AdamW) or added to the gradient (SGD); matrices only
  double clip = 1.0;           // global-norm clipping; 0 turns it off
  double momentum = 0.9;       // SGD

  // Throws me::Error naming the optimizer field and what it expects.
  void check() const;
};

// The fields a recipe gives, by name, in fields.lua's order; they depend on the kind (adamw:
// betas, eps; sgd: momentum).
template <class S, class V, std::enable_if_t<std::is_same_v<std::remove_const_t<S>, OptimizerOptions>, int> = 0>
void visit_fields(S& o, V&& v) {
  v("kind", o.kind);
  v("lr", o.lr);
  if (o.kind == "sgd") {
    v("momentum", o.momentum);
  } else {
    v("betas", o.betas);
    v("eps", o.eps);
  }
  v("weight_decay", o.weight_decay);
  v("clip", o.clip);
}

}  // namespace me::optim
