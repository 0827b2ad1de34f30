// The progress line's fields for several ranks: bench/speed/tp_width.sh and people read them, so
// their wording is pinned here (a field renamed silently would empty the table's column).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/train/log_record.h"
#include "engine/train/progress_log.h"
#include "temp_dir.h"

namespace {

// What log_progress_line(r) writes to stdout (the log's info lines go there).
std::string progress_line(const me::train::LogRecord& r) {
  TempDir dir;
  const std::string path = dir.path + "/out.txt";
  std::fflush(stdout);
  const int saved = ::dup(STDOUT_FILENO);
  FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f != nullptr);
  ::dup2(::fileno(f), STDOUT_FILENO);
  me::train::log_progress_line(r);
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  std::fclose(f);
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  return text.str();
}

me::train::LogRecord record() {
  me::train::LogRecord r;
  r.iteration = 20, r.iters = 20, r.consumed_samples = 160, r.global_batch = 8;
  r.lr = 3e-4, r.loss = 7.08, r.grad_norm = 34.5, r.ms_per_iter = 107.8, r.tokens_per_s = 151822, r.tflops_per_gpu = 476.6;
  return r;
}

}  // namespace

TEST_CASE("the progress line gives each rank's own step time and TP barrier waits when measured", "[progress_log]") {
  auto r = record();
  SECTION("one rank: neither") {
    const auto line = progress_line(r);
    CHECK_THAT(line, Catch::Contains("lm loss: 7.080000E+00"));
    CHECK_THAT(line, !Catch::Contains("own step ms"));
    CHECK_THAT(line, !Catch::Contains("TP barriers"));
  }
  SECTION("several ranks without copy-engine collectives: the own step time only") {
    r.rank_ms_min = 107.4, r.rank_ms_median = 107.5, r.rank_ms_max = 107.9, r.slowest_rank = 1;
    const auto line = progress_line(r);
    CHECK_THAT(line, Catch::Contains("own step ms over ranks (min/median/max): 107.4/107.5/107.9 (max: rank 1)"));
    CHECK_THAT(line, !Catch::Contains("TP barriers"));
  }
  SECTION("with the copy engines: the barrier waits and the rank that waits least") {
    r.rank_ms_min = 107.4, r.rank_ms_median = 107.5, r.rank_ms_max = 107.9, r.slowest_rank = 1;
    r.barrier_ms = {0.98, 2.47, 2.6, 3};
    const auto line = progress_line(r);
    // tp_width.sh's sed expression reads exactly this
    CHECK_THAT(line, Catch::Contains("GPU ms waiting at TP barriers over ranks (min/median/max): 0.98/2.47/2.60 (min: rank 3)"));
    CHECK_THAT(line, !Catch::Contains("waiting for its GPU"));
  }
  SECTION("on GPUs: each host's wait for its GPU at the gradient norm, and the rank that waits least") {
    r.rank_ms_min = 107.4, r.rank_ms_median = 107.5, r.rank_ms_max = 107.9, r.slowest_rank = 1;
    r.host_wait_ms = {0.04, 11.5, 12.25, 2};
    const auto line = progress_line(r);
    CHECK_THAT(line, Catch::Contains("host ms waiting for its GPU over ranks (min/median/max): 0.04/11.50/12.25 (min: rank 2)"));
    CHECK_THAT(line, !Catch::Contains("TP barriers"));
    CHECK_THAT(line, !Catch::Contains("ahead of its GPU"));
  }
  SECTION("on GPUs: each host's lead over its GPU at its micro-batches, and the rank with the least") {
    r.rank_ms_min = 107.4, r.rank_ms_median = 107.5, r.rank_ms_max = 107.9, r.slowest_rank = 1;
    r.host_lead_ms = {0.01, 3.5, 9.25, 3}, r.host_lead_least_ms = 0;
    r.host_lead_least_rank = 2, r.host_lead_least_at = -1;
    auto line = progress_line(r);
    // tp_width.sh reads it with spread_over_ranks
    CHECK_THAT(line, Catch::Contains("host ms ahead of its GPU at micro-batches (each rank's median) over ranks "
                                     "(min/median/max): 0.01/3.50/9.25 (min: rank 3), least of all 0.00 "
                                     "(rank 2, micro-batch 1's backward)"));
    r.host_lead_least_at = 3;
    CHECK_THAT(progress_line(r), Catch::Contains("least of all 0.00 (rank 2, micro-batch 3's forward)"));
  }
}
