// Where a layout's groups fall on the cluster, for the dry run: which global ranks form each
// tensor-, pipeline- and data-parallel group and which node each rank is on, with Slurm's block
// distribution (rank r on node r / gpus_per_node). Tensor parallelism talks at every layer, so
// its groups must stay inside a node (NVLink); the report says whether they do.
#pragma once
#include <string>

#include "engine/comm/rank_grid.h"

namespace me::plan {

// "0-3", "0,8", "0-3,8-11": ascending ranks with consecutive runs folded.
std::string rank_ranges(const comm::RankGroup& ranks);

// Whether every tensor-parallel group of `grid` lies on one node.
bool tp_inside_nodes(const comm::RankGrid& grid, int gpus_per_node);

// The layout table: sizes, each kind's groups (the first max_groups of them) with their nodes,
// and the NVLink check.
std::string describe_layout(const comm::RankGrid& grid, int gpus_per_node, int max_groups = 8);

}  // namespace me::plan
