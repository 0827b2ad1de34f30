#include "engine/plan/layout_report.h"

#include <sstream>

#include "engine/core/error.h"

namespace me::plan {

std::string rank_ranges(const comm::RankGroup& ranks) {
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    os << (i ? "," : "") << ranks[i];
    if (j > i) os << (j == i + 1 ? "," : "-") << ranks[j];
    i = j + 1;
  }
  return os.str();
}

namespace {

comm::RankGroup nodes_of(const comm::RankGroup& ranks, int gpus_per_node) {
  comm::RankGroup nodes;
  for (int r : ranks)
    if (nodes.empty() || nodes.back() != r / gpus_per_node) nodes.push_back(r / gpus_per_node);
  return nodes;
}

void describe_groups(std::ostringstream& os, const char* kind, const std::vector<comm::RankGroup>& groups,
                     int gpus_per_node, int max_groups) {
  if (groups.front().size() == 1) {  // every rank alone: nothing to list
    os << "\n  " << kind << " 1: none";
    return;
  }
  os << "\n  " << kind << " groups (" << groups.size() << " x " << groups.front().size() << " ranks):";
  const int shown = std::min<int>(static_cast<int>(groups.size()), max_groups);
  for (int i = 0; i < shown; ++i) {
    const auto nodes = nodes_of(groups[static_cast<size_t>(i)], gpus_per_node);
    os << (i ? " |" : "") << " {" << rank_ranges(groups[static_cast<size_t>(i)]) << "} node"
       << (nodes.size() > 1 ? "s " : " ") << rank_ranges(nodes);
  }
  if (shown < static_cast<int>(groups.size())) os << " | ... " << groups.size() - static_cast<size_t>(shown) << " more";
}

}  // namespace

bool tp_inside_nodes(const comm::RankGrid& grid, int gpus_per_node) {
  for (const auto& g : grid.all_tp_groups())
    if (nodes_of(g, gpus_per_node).size() > 1) return false;
  return true;
}

std::string describe_layout(const comm::RankGrid& grid, int gpus_per_node, int max_groups) {
  ME_CHECK(gpus_per_node > 0, "--gpus-per-node must be a positive integer, got ", gpus_per_node);
  const auto& l = grid.layout();
  const int nodes = (l.world + gpus_per_node - 1) / gpus_per_node;
  std::ostringstream os;
  os << "layout: " << l.world << " GPU" << (l.world == 1 ? "" : "s") << " = tp " << l.tp << " x pp " << l.pp
     << " x dp " << l.dp() << " on " << nodes << " node" << (nodes == 1 ? "" : "s") << " of " << gpus_per_node
     << " GPUs (Megatron's rank order: tp fastest, then dp, then pp; Slurm puts rank r on node r / "
     << gpus_per_node << ")";
  describe_groups(os, "tp", grid.all_tp_groups(), gpus_per_node, max_groups);
  describe_groups(os, "pp", grid.all_pp_groups(), gpus_per_node, max_groups);
  describe_groups(os, "dp", grid.all_dp_groups(), gpus_per_node, max_groups);
  if (l.tp == 1)
    os << "\n  no tensor parallelism: nothing needs NVLink at every layer";
  else if (tp_inside_nodes(grid, gpus_per_node))
    os << "\n  every tp group is inside one node: tensor parallelism stays on NVLink";
  else
    os << "\n  WARNING: tp " << l.tp << " is larger than a node's " << gpus_per_node
       << " GPUs: tensor-parallel groups span nodes and every layer's all-reduce crosses the network; use tp <= "
       << gpus_per_node;
  return os.str();
}

}  // namespace me::plan
