// RankGrid must reproduce Megatron-Core's rank order ("tp-cp-ep-dp-pp", ep = 1) exactly, so
// the reference layouts below are written out literally rather than recomputed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "engine/comm/rank_grid.h"
#include "engine/core/error.h"

using me::comm::Coords;
using me::comm::Layout;
using me::comm::RankGrid;
using Groups = std::vector<std::vector<int>>;

TEST_CASE("Layout derives dp from the world", "[rank_grid]") {
  CHECK(Layout{16, 4, 2}.dp() == 2);
  CHECK(Layout{16, 2, 2, 2}.dp() == 2);
  CHECK(Layout{8, 1, 1}.dp() == 8);
}

TEST_CASE("reference: 16 ranks, tp 4, pp 2", "[rank_grid]") {
  const RankGrid grid(16, 4, 2);
  CHECK(grid.all_tp_groups() == Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}});
  CHECK(grid.all_pp_groups() ==
        Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
  CHECK(grid.all_dp_groups() ==
        Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK(grid.tp_group(6) == std::vector<int>{4, 5, 6, 7});
  CHECK(grid.pp_group(6) == std::vector<int>{6, 14});
  CHECK(grid.dp_group(6) == std::vector<int>{2, 6});
  CHECK(grid.coords(6) == Coords{2, 0, 1, 0});   // tp 2, cp 0, dp 1, pp 0
  CHECK(grid.coords(13) == Coords{1, 0, 1, 1});  // tp 1, cp 0, dp 1, pp 1
  CHECK(grid.model_parallel_group(6) == std::vector<int>{4, 5, 6, 7, 12, 13, 14, 15});
  CHECK(grid.embedding_group(6) == std::vector<int>{6, 14});
}

// By hand from Megatron's construction: world 8, tp 2, pp 2 leaves dp = 8 / 4 = 2, and with
// the order tp-cp-dp-pp a rank is  rank = tp + 2 * dp + 4 * pp  (cp = 1 adds nothing).
//   tp groups: vary tp only      -> {0,1} {2,3} {4,5} {6,7}
//   dp groups: vary dp (stride 2) -> {0,2} {1,3} {4,6} {5,7}  (numbered by tp, then pp)
//   pp groups: vary pp (stride 4) -> {0,4} {1,5} {2,6} {3,7}  (numbered by tp, then dp)
//   model-parallel ("tp-pp"): fix dp -> dp 0: {0,1,4,5}, dp 1: {2,3,6,7}
//   embedding: first and last stage of the pp group -> rank 5: {1,5}; pp = 2 so that is all
//   cp groups: cp = 1, so every rank is alone.
TEST_CASE("reference: 8 ranks, tp 2, pp 2 (worked by hand)", "[rank_grid]") {
  const RankGrid grid(8, 2, 2);
  CHECK(grid.all_tp_groups() == Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(grid.all_dp_groups() == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(grid.all_pp_groups() == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(grid.all_model_parallel_groups() == Groups{{0, 1, 4, 5}, {2, 3, 6, 7}});
  CHECK(grid.all_cp_groups() == Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}});
  CHECK(grid.embedding_group(5) == std::vector<int>{1, 5});
  CHECK(grid.embedding_group(2) == std::vector<int>{2, 6});
  CHECK(grid.coords(5) == Coords{1, 0, 0, 1});
  CHECK(grid.coords(6) == Coords{0, 0, 1, 1});
}

// Megatron's own docstring example for initialize_model_parallel: 16 GPUs, tp 2, pp 4.
TEST_CASE("reference: Megatron docstring, 16 ranks, tp 2, pp 4", "[rank_grid]") {
  const RankGrid grid(16, 2, 4);
  CHECK(grid.all_dp_groups() ==
        Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(grid.all_tp_groups() ==
        Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(grid.all_pp_groups() == Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});
  CHECK(grid.embedding_group(9) == std::vector<int>{1, 13});
}

// Megatron's docstring for context_parallel_size: 8 GPUs, tp 4, cp 2 -> cp groups
// [0,4] [1,5] [2,6] [3,7]; cp sits between tp and dp in the order.
TEST_CASE("reference: Megatron docstring, 8 ranks, tp 4, cp 2", "[rank_grid]") {
  const RankGrid grid(8, 4, 1, 2);
  CHECK(grid.all_cp_groups() == Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(grid.all_tp_groups() == Groups{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(grid.layout().dp() == 1);
  CHECK(grid.coords(6) == Coords{2, 1, 0, 0});
  // With cp, a model-parallel group is fixed per (dp, cp): {0..3} and {4..7}.
  CHECK(grid.model_parallel_group(5) == std::vector<int>{4, 5, 6, 7});

  const RankGrid wide(16, 2, 2, 2);  // rank = tp + 2 cp + 4 dp + 8 pp
  CHECK(wide.cp_group(5) == std::vector<int>{5, 7});
  CHECK(wide.dp_group(5) == std::vector<int>{1, 5});
  CHECK(wide.pp_group(5) == std::vector<int>{5, 13});
  CHECK(wide.coords(13) == Coords{1, 0, 1, 1});
}

TEST_CASE("pp == 1: embedding group is the rank alone", "[rank_grid]") {
  const RankGrid grid(4, 2, 1);
  CHECK(grid.embedding_group(3) == std::vector<int>{3});
  CHECK(grid.pp_group(3) == std::vector<int>{3});
  const RankGrid single(1, 1, 1);
  CHECK(single.tp_group(0) == std::vector<int>{0});
  CHECK(single.coords(0) == Coords{0, 0, 0, 0});
}

namespace {

// Every rank is in exactly one group of the kind, each group has `size` sorted members, and
// the per-rank lookup returns the group that holds the rank.
template <typename Lookup>
void check_partition(const RankGrid& grid, const Groups& groups, int size, Lookup group_of) {
  std::map<int, int> seen;
  for (const auto& g : groups) {
    CHECK(static_cast<int>(g.size()) == size);
    CHECK(std::is_sorted(g.begin(), g.end()));
    for (int r : g) ++seen[r];
  }
  REQUIRE(static_cast<int>(seen.size()) == grid.world_size());
  for (const auto& [rank, count] : seen) CHECK(count == 1);
  for (int r = 0; r < grid.world_size(); ++r) {
    const auto& g = group_of(r);
    CHECK(std::find(g.begin(), g.end(), r) != g.end());
  }
}

}  // namespace

TEST_CASE("every layout of 1..16 ranks partitions cleanly", "[rank_grid]") {
  for (int world = 1; world <= 16; ++world) {
    for (int tp = 1; tp <= world; ++tp) {
      for (int pp = 1; pp <= world; ++pp) {
        for (int cp = 1; cp <= world; ++cp) {
          if (world % (tp * pp * cp) != 0) continue;
          INFO("world " << world << " tp " << tp << " pp " << pp << " cp " << cp);
          const RankGrid grid(world, tp, pp, cp);
          const int dp = grid.layout().dp();

          check_partition(grid, grid.all_tp_groups(), tp, [&](int r) { return grid.tp_group(r); });
          check_partition(grid, grid.all_pp_groups(), pp, [&](int r) { return grid.pp_group(r); });
          check_partition(grid, grid.all_dp_groups(), dp, [&](int r) { return grid.dp_group(r); });
          check_partition(grid, grid.all_cp_groups(), cp, [&](int r) { return grid.cp_group(r); });
          check_partition(grid, grid.all_model_parallel_groups(), tp * pp,
                          [&](int r) { return grid.model_parallel_group(r); });

          // Tensor-parallel peers are consecutive ranks (the fastest dimension).
          for (const auto& g : grid.all_tp_groups())
            for (size_t i = 1; i < g.size(); ++i) CHECK(g[i] == g[i - 1] + 1);

          for (int r = 0; r < world; ++r) {
            const Coords c = grid.coords(r);
            CHECK(grid.rank_of(c) == r);
            // Pipeline is the outermost dimension, tensor the innermost.
            CHECK(c.pp == r / (tp * cp * dp));
            CHECK(c.tp == r % tp);
            // Peers in a group differ from r only along that group's dimension.
            for (int peer : grid.dp_group(r)) {
              const Coords p = grid.coords(peer);
              CHECK((p.tp == c.tp && p.cp == c.cp && p.pp == c.pp));
            }
            const auto emb = grid.embedding_group(r);
            CHECK(static_cast<int>(emb.size()) == (pp == 1 ? 1 : 2));
            CHECK(emb.front() == grid.pp_group(r).front());
            CHECK(emb.back() == grid.pp_group(r).back());
          }
        }
      }
    }
  }
}

TEST_CASE("bad layouts are rejected with clear messages", "[rank_grid]") {
  using Catch::Contains;
  REQUIRE_THROWS_WITH(RankGrid(12, 4, 2),
                      Contains("world size 12 is not divisible by tp*pp*cp = 8 (tp=4, pp=2, cp=1)"));
  REQUIRE_THROWS_WITH(RankGrid(16, 2, 2, 3),
                      Contains("world size 16 is not divisible by tp*pp*cp = 12 (tp=2, pp=2, cp=3)"));
  REQUIRE_THROWS_WITH(RankGrid(8, 0, 1), Contains("tp must be a positive integer, got 0"));
  REQUIRE_THROWS_WITH(RankGrid(8, 1, -2), Contains("pp must be a positive integer, got -2"));
  REQUIRE_THROWS_WITH(RankGrid(8, 1, 1, 0), Contains("cp must be a positive integer, got 0"));
  REQUIRE_THROWS_WITH(RankGrid(0, 1, 1), Contains("world size must be a positive integer, got 0"));
  REQUIRE_THROWS_AS(RankGrid(Layout{6, 4, 1}), me::Error);

  const RankGrid grid(8, 2, 2);
  REQUIRE_THROWS_WITH(grid.coords(8), Contains("rank 8 is out of range for world size 8"));
  REQUIRE_THROWS_WITH(grid.tp_group(-1), Contains("rank -1 is out of range"));
  REQUIRE_THROWS_AS(grid.rank_of(Coords{2, 0, 0, 0}), me::Error);
}

TEST_CASE("describe gives a short table", "[rank_grid]") {
  const std::string text = RankGrid(8, 2, 2).describe();
  CHECK_THAT(text, Catch::Contains("world 8 = tp 2 x cp 1 x dp 2 x pp 2"));
  CHECK_THAT(text, Catch::Contains("rank   tp   cp   dp   pp"));
  CHECK_THAT(text, Catch::Contains("   5    1    0    0    1"));
  CHECK_THAT(RankGrid(64, 8, 2).describe(), Catch::Contains("(32 more ranks)"));
}
