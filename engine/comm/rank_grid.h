// Which ranks talk to which: the parallel layout of a job (tensor, context, data and pipeline
// parallelism) laid over the global ranks, in Megatron-Core's rank order, so checkpoints,
// logs and mental models carry over from Megatron and every rank builds identical groups.
//
// Megatron-Core's default order string is "tp-cp-ep-dp-pp" (first = fastest varying). Expert
// parallelism is fixed at 1 here, so a rank decomposes as
//   rank = tp + cp * TP + dp * TP * CP + pp * TP * CP * DP
// Tensor-parallel peers are adjacent ranks (same node, NVLink); pipeline stages are the
// farthest apart (they exchange only activations, point to point).
#pragma once
#include <string>
#include <vector>

namespace me::comm {

// The sizes of a layout. dp is not given: it is whatever is left of the world.
struct Layout {
  int world = 1, tp = 1, pp = 1, cp = 1;
  int dp() const { return world / (tp * pp * cp); }
};

// A rank's index along each parallel dimension.
struct Coords {
  int tp = 0, cp = 0, dp = 0, pp = 0;
};
bool operator==(const Coords& a, const Coords& b);

using RankGroup = std::vector<int>;  // global ranks, sorted ascending

class RankGrid {
 public:
  // Throws me::Error when a size is not positive or the world is not divisible by tp*pp*cp.
  RankGrid(int world_size, int tp, int pp, int cp = 1);
  explicit RankGrid(const Layout& layout);

  const Layout& layout() const { return layout_; }
  int world_size() const { return layout_.world; }

  Coords coords(int rank) const;
  int rank_of(const Coords& c) const;

  // The group of each kind that `rank` belongs to (including `rank` itself).
  const RankGroup& tp_group(int rank) const;
  const RankGroup& pp_group(int rank) const;
  const RankGroup& dp_group(int rank) const;
  const RankGroup& cp_group(int rank) const;
  // All tp x pp ranks that hold one full copy of the model (same dp and cp index).
  const RankGroup& model_parallel_group(int rank) const;
  // First and last stage of the rank's pipeline, which hold the tied word embeddings;
  // only the rank itself when pp == 1. Non-members get their pipeline's pair as well.
  RankGroup embedding_group(int rank) const;

  // Every group of a kind, in Megatron's creation order. Creating communicators in this
  // order on every rank keeps collective group creation consistent across the job.
  const std::vector<RankGroup>& all_tp_groups() const { return tp_.groups; }
  const std::vector<RankGroup>& all_pp_groups() const { return pp_.groups; }
  const std::vector<RankGroup>& all_dp_groups() const { return dp_.groups; }
  const std::vector<RankGroup>& all_cp_groups() const { return cp_.groups; }
  const std::vector<RankGroup>& all_model_parallel_groups() const { return mp_.groups; }

  // A short human-readable table: sizes, then one row of coordinates per rank.
  std::string describe() const;

 private:
  // All groups of one kind plus, for each rank, the index of the group that holds it.
  struct GroupSet {
    std::vector<RankGroup> groups;
    std::vector<int> group_of_rank;
  };
  GroupSet build_groups(const std::vector<bool>& in_group) const;
  void check_rank(int rank) const;

  Layout layout_;
  std::vector<int> sizes_;    // per dimension, in order tp, cp, dp, pp
  std::vector<int> strides_;  // rank stride of each dimension
  GroupSet tp_, pp_, dp_, cp_, mp_;
};

}  // namespace me::comm
