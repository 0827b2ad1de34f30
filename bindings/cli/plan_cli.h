// `megaengine plan RECIPE --nodes N --gpus-per-node G [--gpu NAME | --profile FILE]`: every
// layout of the recipe's model on that cluster, ranked by estimated step time
// (engine/plan/layout_search.h), through the recipe file as `megaengine RECIPE` reads it.
#pragma once

namespace me::lua {

// argv after "plan"; returns the exit status (0, 1 on bad input, 2 on bad usage).
int plan_main(int argc, char** argv);

}  // namespace me::lua
