// Slurm host-list expansion, on the shapes SLURM_JOB_NODELIST really takes.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "engine/launch/hostlist.h"
#include "engine/core/error.h"

using me::launch::expand_hostlist;
using me::launch::first_host;
using Hosts = std::vector<std::string>;

TEST_CASE("plain host names", "[hostlist]") {
  CHECK(expand_hostlist("node1") == Hosts{"node1"});
  CHECK(expand_hostlist("head") == Hosts{"head"});
  CHECK(expand_hostlist("a,b,c") == Hosts{"a", "b", "c"});
}

TEST_CASE("simple ranges", "[hostlist]") {
  CHECK(expand_hostlist("a[1-3]") == Hosts{"a1", "a2", "a3"});
  CHECK(expand_hostlist("n[5]") == Hosts{"n5"});
  CHECK(expand_hostlist("n[3-3]") == Hosts{"n3"});
}

TEST_CASE("zero padding follows the width of the lower bound", "[hostlist]") {
  CHECK(expand_hostlist("gpu-[08-11]") == Hosts{"gpu-08", "gpu-09", "gpu-10", "gpu-11"});
  CHECK(expand_hostlist("x[9-11]") == Hosts{"x9", "x10", "x11"});
  CHECK(expand_hostlist("n[098-101]") == Hosts{"n098", "n099", "n100", "n101"});
}

TEST_CASE("ranges and single numbers mixed, plus a plain host", "[hostlist]") {
  CHECK(expand_hostlist("p5-[001-004,007],head") ==
        Hosts{"p5-001", "p5-002", "p5-003", "p5-004", "p5-007", "head"});
  CHECK(expand_hostlist("n[1,3,5-6]") == Hosts{"n1", "n3", "n5", "n6"});
}

TEST_CASE("several bracket groups form a product, leftmost outermost", "[hostlist]") {
  CHECK(expand_hostlist("r[1-2]-n[1-2]") == Hosts{"r1-n1", "r1-n2", "r2-n1", "r2-n2"});
  CHECK(expand_hostlist("rack[1-2]-node[01-03]") ==
        Hosts{"rack1-node01", "rack1-node02", "rack1-node03", "rack2-node01", "rack2-node02",
              "rack2-node03"});
  CHECK(expand_hostlist("[1-2]x") == Hosts{"1x", "2x"});
}

TEST_CASE("several entries with brackets", "[hostlist]") {
  CHECK(expand_hostlist("gpu-[01-02],cpu-[7,9],login") ==
        Hosts{"gpu-01", "gpu-02", "cpu-7", "cpu-9", "login"});
  CHECK(expand_hostlist("a[1-2],b[1-2]-c[3,4]") ==
        Hosts{"a1", "a2", "b1-c3", "b1-c4", "b2-c3", "b2-c4"});
}

TEST_CASE("first_host is the first expanded name", "[hostlist]") {
  CHECK(first_host("p5-[001-004,007],head") == "p5-001");
  CHECK(first_host("node1") == "node1");
  CHECK(first_host("gpu-[08-11]") == "gpu-08");
  REQUIRE_THROWS_AS(first_host(""), me::Error);
}

TEST_CASE("malformed host lists are rejected with the spec quoted", "[hostlist]") {
  using Catch::Contains;
  REQUIRE_THROWS_WITH(expand_hostlist(""), Contains("empty"));

  // Unbalanced or nested brackets.
  REQUIRE_THROWS_WITH(expand_hostlist("a[1-3"), Contains("'a[1-3'") && Contains("unbalanced"));
  REQUIRE_THROWS_WITH(expand_hostlist("a1-3]"), Contains("'a1-3]'") && Contains("unbalanced"));
  REQUIRE_THROWS_WITH(expand_hostlist("a[1-2],b[3"), Contains("unbalanced"));
  REQUIRE_THROWS_WITH(expand_hostlist("a[[1-2]]"), Contains("nested"));

  // Empty range parts.
  REQUIRE_THROWS_WITH(expand_hostlist("a[]"), Contains("'a[]'") && Contains("empty range"));
  REQUIRE_THROWS_WITH(expand_hostlist("a[1-]"), Contains("empty range part"));
  REQUIRE_THROWS_WITH(expand_hostlist("a[-3]"), Contains("empty range part"));
  REQUIRE_THROWS_WITH(expand_hostlist("a[1,,3]"), Contains("empty range part"));
  REQUIRE_THROWS_WITH(expand_hostlist("a[1,]"), Contains("empty range part"));

  // Upper bound below lower bound.
  REQUIRE_THROWS_WITH(expand_hostlist("a[5-3]"), Contains("'a[5-3]'") && Contains("upper bound"));

  // Non-numeric ranges.
  REQUIRE_THROWS_WITH(expand_hostlist("a[x-z]"), Contains("'a[x-z]'") && Contains("not numeric"));
  REQUIRE_THROWS_WITH(expand_hostlist("a[1-b]"), Contains("not numeric"));
  REQUIRE_THROWS_WITH(expand_hostlist("a[1-2-3]"), Contains("not numeric"));
  REQUIRE_THROWS_WITH(expand_hostlist("a[ 1]"), Contains("not numeric"));

  // Empty entries from stray commas.
  REQUIRE_THROWS_WITH(expand_hostlist("a,,b"), Contains("empty entry"));
  REQUIRE_THROWS_WITH(expand_hostlist("a,"), Contains("empty entry"));
  REQUIRE_THROWS_WITH(expand_hostlist(","), Contains("empty entry"));

  // Absurd sizes fail fast instead of exhausting memory.
  REQUIRE_THROWS_WITH(expand_hostlist("n[0-99999999]"), Contains("more than"));
  REQUIRE_THROWS_WITH(expand_hostlist("n[1234567890]"), Contains("digits"));
  // Found by fuzzing (scripts/fuzz.sh hostlist): 95 bytes, ~989k names of 89 characters; it
  // used to allocate them all (and a 4 KB name would have asked for 4 GB). Now it is refused.
  const std::string found = "rae" + std::string(81, '\xff') + "8[0-988888]";
  REQUIRE_THROWS_WITH(expand_hostlist(found), Contains("more than 32 MiB of host names"));
  REQUIRE_THROWS_WITH(expand_hostlist(std::string(4000, 'x') + "[0-999998]"), Contains("MiB of host names"));
  REQUIRE_THROWS_WITH(expand_hostlist("a[0-9999]b[0-99]" + std::string(100, 'c')), Contains("MiB of host names"));
  REQUIRE_THROWS_WITH(expand_hostlist(std::string(3000, 'x') + "[0-9999]," + std::string(3000, 'y') + "[0-9999]"),
                      Contains("MiB of host names"));
  // A big but real cluster still expands.
  REQUIRE(expand_hostlist("gpu-st-p5-[000001-100000]").size() == 100000);

  // Every failure is an me::Error, so the CLI can print it cleanly.
  REQUIRE_THROWS_AS(expand_hostlist("a[5-3]"), me::Error);
}
