// The training loader (engine/data/gpt_loader.cpp): Megatron's sample order across data-parallel
// ranks, resuming from consumed_samples, blended splits, loss masking at end-of-document, and a
// clear error when the split runs out.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/data/gpt_loader.h"
#include "engine/data/indexed_dataset.h"
#include "temp_dir.h"

using namespace me::data;
using Catch::Contains;

namespace {

// 300 sequences of 5..40 tokens; token values count up, so every token is distinguishable.
std::string write_dataset(const TempDir& dir, const std::string& name, int64_t base) {
  IndexedDatasetWriter w(dir / name, DType::int32);
  int64_t next = base;
  for (int s = 0; s < 300; ++s) {
    std::vector<int64_t> seq(5 + (s * 7) % 36);
    for (auto& t : seq) t = next++;
    w.add_sequence(seq);
    w.end_document();
  }
  w.finalize();
  return dir / name;
}

GPTDataConfig config(const std::vector<std::pair<double, std::string>>& blend) {
  GPTDataConfig c;
  c.blend = blend;
  c.split = "90,10,0";
  c.seq_length = 16;
  c.seed = 5;
  return c;
}

std::vector<int64_t> row(const torch::Tensor& t, int64_t r) {
  auto x = t[r].contiguous();
  return std::vector<int64_t>(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel());
}

}  // namespace

TEST_CASE("loader: DP ranks split every global batch in Megatron's order", "[loader]") {
  TempDir dir;
  const auto splits = build_gpt_splits(config({{1.0, write_dataset(dir, "a", 0)}}), {200, 8, 0}, true);
  REQUIRE(splits[0]->size() >= 200);
  REQUIRE(splits[1]->size() >= 8);
  CHECK(splits[2] == nullptr);
  // Global batch 12 = micro 2 x dp 3 x accumulation 2.
  LoaderOptions o;
  o.micro = 2;
  o.dp = 3;
  o.accumulation = 2;
  for (int64_t step = 0; step < 4; ++step) {
    std::set<std::vector<int64_t>> union_of_ranks;
    for (int64_t r = 0; r < 3; ++r) {
      o.dp_rank = r;
      o.consumed_samples = step * 12;
      BatchLoader loader(splits[0], o);
      const auto b = loader.next();
      REQUIRE(b.tokens.sizes() == torch::IntArrayRef({4, 16}));
      REQUIRE(b.labels.sizes() == torch::IntArrayRef({4, 16}));
      CHECK(b.first_sample == step * 12);
      for (int64_t m = 0; m < 2; ++m)
        for (int64_t j = 0; j < 2; ++j) {
          // micro-batch m of rank r holds samples consumed + (m x dp + r) x micro + j
          const auto want = splits[0]->sample(static_cast<size_t>(step * 12 + (m * 3 + r) * 2 + j));
          const auto tokens = row(b.tokens, m * 2 + j), labels = row(b.labels, m * 2 + j);
          CHECK(tokens == std::vector<int64_t>(want.begin(), want.end() - 1));
          CHECK(labels == std::vector<int64_t>(want.begin() + 1, want.end()));
          union_of_ranks.insert(tokens);
        }
    }
    CHECK(union_of_ranks.size() == 12);  // the ranks' shares are disjoint and cover the batch
  }
}

TEST_CASE("loader: a loader started at consumed_samples = K gives the batches a continuing one gives", "[loader]") {
  TempDir dir;
  const auto splits = build_gpt_splits(config({{1.0, write_dataset(dir, "a", 0)}}), {160, 0, 0}, true);
  LoaderOptions o;
  o.micro = 4;
  o.dp = 2;
  for (int64_t rank = 0; rank < 2; ++rank) {
    o.dp_rank = rank;
    o.consumed_samples = 0;
    BatchLoader through(splits[0], o);
    std::vector<torch::Tensor> seen;
    for (int i = 0; i < 10; ++i) seen.push_back(through.next().tokens);
    CHECK(through.consumed_samples() == 80);
    o.consumed_samples = 40;  // stopped after 5 steps of 8
    BatchLoader resumed(splits[0], o);
    for (int i = 5; i < 10; ++i) CHECK(torch::equal(resumed.next().tokens, seen[static_cast<size_t>(i)]));
    CHECK(resumed.consumed_samples() == 80);
  }
}

TEST_CASE("loader: the split running out is a clear error, raised again if asked again", "[loader]") {
  TempDir dir;
  const auto splits = build_gpt_splits(config({{1.0, write_dataset(dir, "a", 0)}}), {16, 0, 0}, true);
  LoaderOptions o;
  o.micro = 8;
  o.consumed_samples = static_cast<int64_t>(splits[0]->size()) - 4;
  BatchLoader loader(splits[0], o);
  REQUIRE_THROWS_WITH(loader.next(), Contains("but the training split has"));
  REQUIRE_THROWS_WITH(loader.next(), Contains("but the training split has"));
}

TEST_CASE("loader: eod positions are masked out of the loss when asked", "[loader]") {
  TempDir dir;
  const auto splits = build_gpt_splits(config({{1.0, write_dataset(dir, "a", 0)}}), {8, 0, 0}, true);
  LoaderOptions o;
  o.micro = 8;
  o.prefetch = 0;
  const auto plain = BatchLoader(splits[0], o).next();
  const int64_t eod = plain.tokens[0][3].item<int64_t>();  // any token value that occurs
  o.eod = eod;
  o.eod_mask_loss = true;
  const auto masked = BatchLoader(splits[0], o).next();
  CHECK(torch::equal(masked.tokens, plain.tokens));
  CHECK(torch::equal(masked.labels.eq(-100), plain.tokens.eq(eod)));
  CHECK(masked.labels.eq(-100).sum().item<int64_t>() >= 1);
}

TEST_CASE("loader: a token id outside the model's vocabulary names the file, document and id", "[loader]") {
  TempDir dir;
  // Three documents of ids below 100, one id 5000 in the middle one.
  IndexedDatasetWriter w(dir / "oov", DType::uint16);
  for (int d = 0; d < 3; ++d) {
    std::vector<int64_t> t(40);
    for (size_t j = 0; j < t.size(); ++j) t[j] = static_cast<int64_t>((d * 40 + j) % 100);
    if (d == 1) t[17] = 5000;
    w.add_sequence(t);
    w.end_document();
  }
  w.finalize();
  auto c = config({{1.0, dir / "oov"}});
  c.split = "100,0,0";
  const auto splits = build_gpt_splits(c, {7, 0, 0}, true);  // one epoch: all 7 samples of 16 + 1 tokens
  REQUIRE(splits[0]->size() == 7);
  LoaderOptions o;
  o.micro = 7;
  o.vocab_limit = 5000;
  const std::string want = "token id 5000 in '" + dir / "oov.bin" + "' (document 1, sequence 1, token 17; sample ";
  BatchLoader loader(splits[0], o);
  REQUIRE_THROWS_WITH(loader.next(), Contains(want) && Contains("vocabulary of 5000 ids (model.vocab)") &&
                                         Contains("preprocess it again") && Contains("at least 5001"));
  // the same check on the batches cut directly (validation), and none without a limit
  std::vector<int64_t> all(7);
  for (int64_t i = 0; i < 7; ++i) all[static_cast<size_t>(i)] = i;
  REQUIRE_THROWS_WITH(make_token_batch(*splits[0], all, false, -1, 5000), Contains(want));
  CHECK(make_token_batch(*splits[0], all, false, -1, 5001).tokens.max().item<int64_t>() == 5000);
  CHECK(make_token_batch(*splits[0], all, false, -1).tokens.numel() == 7 * 16);
  // the batches before the one holding it are served
  o.micro = 1;
  o.prefetch = 0;
  BatchLoader one_by_one(splits[0], o);
  int served = 0;
  try {
    for (; served < 7; ++served) one_by_one.next();
  } catch (const me::Error& e) {
    CHECK_THAT(e.what(), Contains(want));
  }
  CHECK(served < 7);
}

TEST_CASE("loader: blended splits draw from each dataset by weight; bad splits are named", "[loader]") {
  TempDir dir;
  const auto a = write_dataset(dir, "a", 0), b = write_dataset(dir, "b", 1000000);
  const auto splits = build_gpt_splits(config({{0.25, a}, {0.75, b}}), {400, 0, 0}, true);
  REQUIRE(splits[0]->size() == 400);
  int from_b = 0;
  for (size_t i = 0; i < 400; ++i) from_b += splits[0]->sample(i)[0] >= 1000000;
  CHECK(from_b == 300);

  auto c = config({{1.0, a}});
  c.split = "100,0,0";
  REQUIRE_THROWS_WITH(build_gpt_splits(c, {10, 5, 0}, true),
                      Contains("the valid split of '" + a + "' is empty") && Contains("train.eval_iters = 0"));
  REQUIRE_THROWS_WITH(build_gpt_splits(config({{1.0, dir / "missing"}}), {10, 0, 0}, true),
                      Contains(dir / "missing"));
}
