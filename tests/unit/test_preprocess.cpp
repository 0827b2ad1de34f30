// `megaengine preprocess` (engine/data/preprocess.cpp): every document round-trips through the
// .bin/.idx it writes, the output does not depend on the number of workers or the chunk size,
// and malformed input is an error naming the file and line that leaves nothing behind.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/data/gpt2_tokenizer.h"
#include "engine/data/indexed_dataset.h"
#include "engine/data/jsonl_record.h"
#include "engine/data/preprocess.h"
#include "temp_dir.h"
#include "test_assets.h"

using namespace me::data;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

const GPT2Tokenizer& gpt2() {
  static const GPT2Tokenizer tok(asset("gpt2-encoder.json"), asset("gpt2-vocab.bpe"));
  return tok;
}

// JSON string literal for s (quotes, backslashes and control characters escaped).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else out += static_cast<char>(c);
  }
  return out + "\"";
}

// Documents: Moby Dick's paragraphs plus awkward ones (empty, unicode, escapes, very long).
std::vector<std::string> documents() {
  std::vector<std::string> docs;
  const std::string text = slurp(asset("moby-dick.txt")).substr(0, 200000);
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find("\n\n", at);
    if (end == std::string::npos) end = text.size();
    if (end > at) docs.push_back(text.substr(at, end - at));
    at = end + 2;
  }
  docs.push_back("");
  docs.push_back("quote \" backslash \\ tab \t newline \n end");
  docs.push_back("héllo wörld — 日本語 🐳");
  docs.push_back(std::string(100000, 'a'));
  return docs;
}

std::string write_jsonl(const TempDir& dir, const std::vector<std::string>& docs) {
  std::string jsonl;
  for (size_t i = 0; i < docs.size(); ++i) jsonl += "{\"id\": " + std::to_string(i) + ", \"text\": " + json_string(docs[i]) + "}\n";
  const std::string path = dir / "in.jsonl";
  spit(path, jsonl);
  return path;
}

void check_round_trip(const std::string& prefix, const std::vector<std::string>& docs, bool eod) {
  IndexedDataset ds(prefix);
  REQUIRE(ds.documents() == docs.size());
  CHECK(ds.dtype() == DType::uint16);  // Megatron's choice for a 50257-id vocabulary
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<int64_t> got;
    for (int64_t s = ds.document_index()[d]; s < ds.document_index()[d + 1]; ++s) {
      const auto seq = ds.get(static_cast<size_t>(s));
      got.insert(got.end(), seq.begin(), seq.end());
    }
    auto want = gpt2().encode(docs[d]);
    if (eod && !want.empty()) want.push_back(gpt2().eod());
    INFO("document " << d);
    REQUIRE(got == want);
    if (!docs[d].empty()) CHECK(gpt2().decode(std::vector<int64_t>(got.begin(), got.end() - (eod ? 1 : 0))) == docs[d]);
  }
}

}  // namespace

TEST_CASE("preprocess: every jsonl document round-trips, for any workers and chunk size", "[preprocess]") {
  TempDir dir;
  const auto docs = documents();
  PreprocessOptions o;
  o.input = write_jsonl(dir, docs);
  o.append_eod = true;
  o.progress = false;
  o.output = dir / "one";
  o.workers = 1;
  const auto s = preprocess(o, gpt2());
  CHECK(s.documents == static_cast<int64_t>(docs.size()));
  CHECK(s.skipped == 0);
  CHECK(s.bytes == static_cast<int64_t>(fs::file_size(o.input)));
  check_round_trip(o.output, docs, true);

  // Small chunks (many per worker, records longer than a chunk) and several workers: same bytes.
  o.output = dir / "many";
  o.workers = 4;
  o.chunk_bytes = 4096;
  preprocess(o, gpt2());
  CHECK(slurp(dir / "one.bin") == slurp(dir / "many.bin"));
  CHECK(slurp(dir / "one.idx") == slurp(dir / "many.idx"));

  o.output = dir / "noeod";
  o.append_eod = false;
  preprocess(o, gpt2());
  check_round_trip(o.output, docs, false);
}

TEST_CASE("preprocess: text input makes a document of every paragraph", "[preprocess]") {
  TempDir dir;
  spit(dir / "in.txt", "first para\nline two\n\n\n  \nsecond\n\nthird without newline");
  PreprocessOptions o;
  o.input = dir / "in.txt";
  o.format = "text";
  o.output = dir / "out";
  o.progress = false;
  o.chunk_bytes = 8;  // boundaries fall inside paragraphs
  preprocess(o, gpt2());
  check_round_trip(o.output, {"first para\nline two", "second", "third without newline"}, false);
}

TEST_CASE("preprocess: a malformed record names the file and line, and nothing is written", "[preprocess]") {
  TempDir dir;
  const std::string good = "{\"text\": \"fine\"}\n";
  struct Bad {
    std::string line, message;
  };
  const std::vector<Bad> cases = {
      {"{\"text\": \"unterminated}", "malformed JSON"},
      {"[1, 2]", "a JSON array, expected an object"},
      {"{\"body\": \"no text key\"}", "has no key 'text'"},
      {"{\"text\": 42}", "'text' is a JSON number, expected a string"},
      // Found by fuzzing (scripts/fuzz.sh jsonl_record): a number beyond a double's range threw
      // nlohmann's out_of_range, which nothing caught: preprocess aborted.
      {"{\"text\": \"fine\", \"n\": 44444e4242}", "unreadable JSON: number overflow parsing '44444e4242'"},
  };
  for (const auto& bad : cases) {
    const std::string path = dir / "bad.jsonl";
    spit(path, good + "\n" + good + bad.line + "\n" + good);  // the bad record is on line 4
    PreprocessOptions o;
    o.input = path;
    o.output = dir / "out";
    o.progress = false;
    o.workers = 2;
    o.chunk_bytes = 16;
    REQUIRE_THROWS_WITH(preprocess(o, gpt2()), Contains(path + ":4: ") && Contains(bad.message) &&
                                                  Contains("--skip-bad-records"));
    CHECK_FALSE(fs::exists(dir / "out.bin"));
    CHECK_FALSE(fs::exists(dir / "out.idx"));
    CHECK_FALSE(fs::exists(dir / "out.bin.tmp"));

    o.skip_bad_records = true;
    const auto s = preprocess(o, gpt2());
    CHECK(s.skipped == 1);
    CHECK(s.documents == 3);
    CHECK(IndexedDataset(o.output).documents() == 3);
    fs::remove(dir / "out.bin");
    fs::remove(dir / "out.idx");
  }
}

TEST_CASE("a jsonl record is a text or a reason, never an exception", "[preprocess]") {
  auto parse = [](const std::string& line) { return parse_jsonl_record(line.data(), line.data() + line.size(), "text"); };
  CHECK(parse("{\"text\": \"caf\\u00e9\"}").text == "caf\xc3\xa9");
  // The fuzzer's finding (tests/fuzz/jsonl_record/overflow): numbers beyond a double's range.
  for (const std::string line : {"44444e4242", "{\"text\": \"a\", \"n\": 1e999}", "[-1e400]"}) {
    const auto r = parse(line);
    CHECK_FALSE(r.ok);
    CHECK_THAT(r.why, Contains("unreadable JSON: number overflow parsing"));
  }
}

TEST_CASE("preprocess: missing input and bad options are clear errors", "[preprocess]") {
  TempDir dir;
  PreprocessOptions o;
  o.input = dir / "nope.jsonl";
  o.output = dir / "out";
  o.progress = false;
  REQUIRE_THROWS_WITH(preprocess(o, gpt2()), Contains("cannot open input '" + o.input + "'"));
  spit(dir / "in.jsonl", "{\"text\": \"x\"}\n");
  o.input = dir / "in.jsonl";
  o.format = "csv";
  REQUIRE_THROWS_WITH(preprocess(o, gpt2()), Contains("input format 'csv' is unknown"));
  o.format = "jsonl";
  o.output = dir / "no/such/dir/out";
  REQUIRE_THROWS_WITH(preprocess(o, gpt2()), Contains("cannot create '" + o.output + ".bin.tmp'"));
  CHECK(megatron_output_prefix("/fsx/x", "text") == "/fsx/x_text_document");
}
