// What a resume compares between the recipe and the checkpoint's own copy of its recipe: the
// model (another model must not load silently: fewer layers would drop some, and the new run
// would become the directory's latest) and the learning-rate schedule (a different train.iters
// would re-stretch it, so the rate would jump at the resume). Torch-free.
#pragma once
#include <string>
#include <vector>

#include "engine/optim/lr_schedule.h"
#include "engine/config/recipe.h"

namespace me::train {

// One line per model field that differs, "model.layers: 2 in the recipe, 4 in the checkpoint".
// Fields that leave the trained weights the same model are not compared: recompute and
// recompute_every (memory), init_std (initialisation) and vocab_divisible_by (padding rows,
// which the loader re-pads); ffn_hidden and query_groups are compared as resolved.
std::vector<std::string> model_differences(const model::TransformerConfig& recipe, const model::TransformerConfig& saved);

// The schedule the checkpoint's run followed: its recipe's schedule over its own iterations and
// global batch (`saved_dp`: its data-parallel size, for a global batch left to micro x dp).
optim::LRSchedule saved_schedule(const config::Recipe& saved, int64_t saved_dp);

// One line per schedule term that differs, "decay ends at 40 (the checkpoint's run) vs 100 (this recipe)".
std::vector<std::string> schedule_differences(const optim::LRSchedule& recipe, const optim::LRSchedule& saved);

}  // namespace me::train
