#include "engine/comm/rank_grid.h"

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <utility>

#include "engine/core/error.h"

namespace me::comm {
namespace {

// Dimension indices, fastest varying first (Megatron's "tp-cp-ep-dp-pp" with ep = 1).
enum Dim { kTp = 0, kCp = 1, kDp = 2, kPp = 3, kNumDims = 4 };

void check_positive(const char* name, int value) {
  ME_CHECK(value > 0, name, " must be a positive integer, got ", value);
}

// Validates before RankGrid's members are built, so no half-made grid is ever observed.
Layout checked_layout(const Layout& l) {
  check_positive("world size", l.world);
  check_positive("tp", l.tp);
  check_positive("pp", l.pp);
  check_positive("cp", l.cp);
  const long long model = static_cast<long long>(l.tp) * l.pp * l.cp;
  ME_CHECK(l.world % model == 0, "world size ", l.world, " is not divisible by tp*pp*cp = ",
           model, " (tp=", l.tp, ", pp=", l.pp, ", cp=", l.cp, ")");
  return l;
}

}  // namespace

bool operator==(const Coords& a, const Coords& b) {
  return a.tp == b.tp && a.cp == b.cp && a.dp == b.dp && a.pp == b.pp;
}

RankGrid::RankGrid(int world_size, int tp, int pp, int cp)
    : RankGrid(Layout{world_size, tp, pp, cp}) {}

RankGrid::RankGrid(const Layout& layout) : layout_(checked_layout(layout)) {
  sizes_ = {layout_.tp, layout_.cp, layout_.dp(), layout_.pp};
  strides_.assign(kNumDims, 1);
  for (int d = 1; d < kNumDims; ++d) strides_[d] = strides_[d - 1] * sizes_[d - 1];

  // Each kind of group is "the ranks that differ only along these dimensions".
  tp_ = build_groups({true, false, false, false});
  cp_ = build_groups({false, true, false, false});
  dp_ = build_groups({false, false, true, false});
  pp_ = build_groups({false, false, false, true});
  mp_ = build_groups({true, false, false, true});  // Megatron's get_ranks("tp-pp")
}

// Megatron's generate_masked_orthogonal_rank_groups: group number g is decomposed over the
// dimensions outside the group (first such dimension fastest), member number m over the
// dimensions inside it (likewise). Strides grow with the dimension index, so members come
// out ascending and groups come out in the order Megatron creates them.
RankGrid::GroupSet RankGrid::build_groups(const std::vector<bool>& in_group) const {
  int group_size = 1;
  for (int d = 0; d < kNumDims; ++d)
    if (in_group[d]) group_size *= sizes_[d];
  const int num_groups = layout_.world / group_size;

  // Turns a linear index into a rank offset, walking only the chosen dimensions.
  auto offset_along = [&](int index, bool inside) {
    int offset = 0;
    for (int d = 0; d < kNumDims; ++d) {
      if (in_group[d] != inside) continue;
      offset += (index % sizes_[d]) * strides_[d];
      index /= sizes_[d];
    }
    return offset;
  };

  GroupSet set;
  set.groups.reserve(num_groups);
  set.group_of_rank.assign(layout_.world, -1);
  for (int g = 0; g < num_groups; ++g) {
    const int base = offset_along(g, /*inside=*/false);
    RankGroup group;
    group.reserve(group_size);
    for (int m = 0; m < group_size; ++m) {
      const int rank = base + offset_along(m, /*inside=*/true);
      group.push_back(rank);
      set.group_of_rank[rank] = g;
    }
    set.groups.push_back(std::move(group));
  }
  return set;
}

void RankGrid::check_rank(int rank) const {
  ME_CHECK(rank >= 0 && rank < layout_.world, "rank ", rank, " is out of range for world size ",
           layout_.world, " (valid ranks are 0..", layout_.world - 1, ")");
}

Coords RankGrid::coords(int rank) const {
  check_rank(rank);
  int idx[kNumDims];
  for (int d = 0; d < kNumDims; ++d) idx[d] = (rank / strides_[d]) % sizes_[d];
  return Coords{idx[kTp], idx[kCp], idx[kDp], idx[kPp]};
}

int RankGrid::rank_of(const Coords& c) const {
  const int idx[kNumDims] = {c.tp, c.cp, c.dp, c.pp};
  int rank = 0;
  for (int d = 0; d < kNumDims; ++d) {
    ME_CHECK(idx[d] >= 0 && idx[d] < sizes_[d], "coordinate ", idx[d],
             " is out of range for a parallel dimension of size ", sizes_[d]);
    rank += idx[d] * strides_[d];
  }
  return rank;
}

const RankGroup& RankGrid::tp_group(int rank) const {
  check_rank(rank);
  return tp_.groups[tp_.group_of_rank[rank]];
}
const RankGroup& RankGrid::pp_group(int rank) const {
  check_rank(rank);
  return pp_.groups[pp_.group_of_rank[rank]];
}
const RankGroup& RankGrid::dp_group(int rank) const {
  check_rank(rank);
  return dp_.groups[dp_.group_of_rank[rank]];
}
const RankGroup& RankGrid::cp_group(int rank) const {
  check_rank(rank);
  return cp_.groups[cp_.group_of_rank[rank]];
}
const RankGroup& RankGrid::model_parallel_group(int rank) const {
  check_rank(rank);
  return mp_.groups[mp_.group_of_rank[rank]];
}

// Same rule as Megatron's default_embedding_ranks.
RankGroup RankGrid::embedding_group(int rank) const {
  const RankGroup& pipeline = pp_group(rank);
  if (pipeline.size() == 1) return {pipeline.front()};
  return {pipeline.front(), pipeline.back()};
}

std::string RankGrid::describe() const {
  // Rows past this are elided: a 1024-rank table helps nobody in a log.
  constexpr int kMaxRows = 32;
  std::ostringstream os;
  os << "world " << layout_.world << " = tp " << layout_.tp << " x cp " << layout_.cp
     << " x dp " << layout_.dp() << " x pp " << layout_.pp
     << " (Megatron order tp-cp-dp-pp, tp fastest)\n";
  os << "rank   tp   cp   dp   pp\n";
  const int rows = std::min(layout_.world, kMaxRows);
  for (int r = 0; r < rows; ++r) {
    const Coords c = coords(r);
    os << std::setw(4) << r << std::setw(5) << c.tp << std::setw(5) << c.cp << std::setw(5)
       << c.dp << std::setw(5) << c.pp << "\n";
  }
  if (rows < layout_.world) os << "... (" << layout_.world - rows << " more ranks)\n";
  return os.str();
}

}  // namespace me::comm
