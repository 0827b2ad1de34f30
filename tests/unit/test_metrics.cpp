// Metrics on disk: the TensorBoard event file read back by an independent reader
// (tests/unit/event_file_reader.h: its own CRC-32C and protobuf parser), and metrics.jsonl
// read back by nlohmann-json.
#include <catch2/catch.hpp>
#include <dirent.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/metrics/crc32c.h"
#include "engine/metrics/metrics_logger.h"
#include "tests/unit/event_file_reader.h"
#include "tests/unit/temp_dir.h"
#if ME_TEST_HAVE_JSON
#include <nlohmann/json.hpp>
#endif

using namespace me::metrics;
using Catch::Contains;

namespace {

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (auto* e = ::readdir(d))
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    ::closedir(d);
  }
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& s) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << s;
}

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// Three log intervals and one evaluation, as the trainer will write them (one NaN grad norm).
std::vector<MetricsRecord> sample_records() {
  std::vector<MetricsRecord> out;
  for (int k = 1; k <= 3; ++k) {
    MetricsRecord r;
    r.step = 10 * k;
    r.wall_time = 1764000000.25 + k;
    r.set(key::lm_loss, 10.5 / k)
        .set(key::learning_rate, 3e-4 * k)
        .set(key::grad_norm, k == 2 ? kNaN : 1.25 * k)
        .set(key::loss_scale, 65536)
        .set(key::skipped_iterations, k >= 2 ? 1 : 0)
        .set(key::nan_iterations, k >= 2 ? 1 : 0)
        .set(key::iteration_time_s, 0.123)
        .set(key::tokens_per_s, 81920.5)
        .set(key::tflops_per_gpu, 412.7)
        .set(key::mfu, 0.417)
        .set(key::peak_memory_bytes, 61234567890.0)
        .set(key::consumed_samples, 5120.0 * k);
    out.push_back(r);
  }
  MetricsRecord eval;
  eval.kind = "eval";
  eval.step = 30;
  eval.wall_time = 1764000004.5;
  eval.set(key::val_loss, 3.25).set(key::val_ppl, std::exp(3.25));
  out.push_back(eval);
  return out;
}

std::string only_event_file(const TempDir& dir) {
  const auto files = list_dir(dir / "tensorboard");
  REQUIRE(files.size() == 1);
  return dir / "tensorboard" + "/" + files[0];
}

bool same_float(float got, double want) {
  return std::isnan(want) ? std::isnan(got) : got == static_cast<float>(want);
}

}  // namespace

TEST_CASE("crc32c matches the published check values", "[metrics]") {
  const std::string digits = "123456789";
  CHECK(me::crc32c(0, digits.data(), digits.size()) == 0xE3069283u);  // the CRC catalogue's check value
  // RFC 3720 (iSCSI) appendix B.4 test vectors
  const std::string zeros(32, '\0'), ones(32, '\xff');
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  CHECK(me::crc32c(0, zeros.data(), 32) == 0x8A9136AAu);
  CHECK(me::crc32c(0, ones.data(), 32) == 0x62A8AB43u);
  CHECK(me::crc32c(0, ascending.data(), 32) == 0x46DD794Eu);
  // continuing a CRC over a second piece equals one pass over both
  CHECK(me::crc32c(me::crc32c(0, digits.data(), 4), digits.data() + 4, 5) == 0xE3069283u);
  // the independent reader's bitwise CRC agrees
  CHECK(evreader::crc32c_bitwise(digits) == 0xE3069283u);
  CHECK(evreader::crc32c_bitwise(ascending) == 0x46DD794Eu);
  CHECK(mask_crc(0) == 0xa282ead8u);
}

TEST_CASE("the event file holds every scalar, step and tag, each record's two CRCs valid", "[metrics]") {
  TempDir dir;
  const auto records = sample_records();
  {
    MetricsLogger log(dir.path);
    log.write_recipe("return { model = me.model.gpt { layers = 2 } } -- a comment\n# not a heading");
    for (const auto& r : records) log.write(r);
  }
  const std::string file = only_event_file(dir);
  CHECK(std::regex_match(file.substr(file.rfind('/') + 1), std::regex(R"(events\.out\.tfevents\.\d{10}\..+)")));
  const auto raw = evreader::read_records(file);  // throws on any CRC mismatch
  REQUIRE(raw.size() == 2 + records.size());

  const auto first = evreader::decode_event(raw[0]);
  CHECK(first.file_version == "brain.Event:2");
  CHECK(first.values.empty());
  CHECK(std::abs(first.wall_time - unix_time_now()) < 600);

  const auto text = evreader::decode_event(raw[1]);
  CHECK(text.step == 0);
  REQUIRE(text.values.size() == 1);
  const auto& tv = text.values[0];
  CHECK(tv.tag == "recipe");
  CHECK(tv.plugin_name == "text");
  CHECK(tv.has_tensor);
  CHECK(tv.dtype == 7);  // DT_STRING
  CHECK(tv.has_shape);
  CHECK(tv.dims.empty());  // a scalar string
  REQUIRE(tv.strings.size() == 1);
  CHECK(tv.strings[0] == "```lua\nreturn { model = me.model.gpt { layers = 2 } } -- a comment\n# not a heading\n```");

  for (size_t i = 0; i < records.size(); ++i) {
    const auto& want = records[i];
    const auto got = evreader::decode_event(raw[2 + i]);
    INFO("record " << i);
    CHECK(got.step == want.step);
    CHECK(got.wall_time == want.wall_time);
    CHECK(got.file_version.empty());
    REQUIRE(got.values.size() == want.values.size());
    for (size_t k = 0; k < want.values.size(); ++k) {
      INFO("value " << want.values[k].first);
      CHECK(got.values[k].tag == tensorboard_tag(want.values[k].first));
      CHECK(got.values[k].has_simple_value);
      CHECK(!got.values[k].has_tensor);
      CHECK(same_float(got.values[k].simple_value, want.values[k].second));
    }
  }
  // Megatron's tags where it has them
  const auto t1 = evreader::decode_event(raw[2]);
  CHECK(t1.values[0].tag == "lm loss");
  CHECK(t1.values[1].tag == "learning-rate");
  CHECK(t1.values[2].tag == "grad-norm");
  CHECK(t1.values[3].tag == "loss-scale");
  const auto ev = evreader::decode_event(raw.back());
  CHECK(ev.values[0].tag == "lm loss validation");
  CHECK(ev.values[1].tag == "lm loss validation ppl");
}

TEST_CASE("each record reaches the file when written, before the writer closes", "[metrics]") {
  TempDir dir;
  TensorBoardWriter w(dir.path);
  CHECK(evreader::read_records(w.path()).size() == 1);  // the file_version event
  MetricsRecord r;
  r.step = 7;
  r.set(key::lm_loss, 2.5);
  w.write_scalars(r);
  const auto raw = evreader::read_records(w.path());
  REQUIRE(raw.size() == 2);
  const auto e = evreader::decode_event(raw[1]);
  CHECK(e.step == 7);
  CHECK(e.values.at(0).simple_value == 2.5f);
  CHECK(e.wall_time > 1.7e9);  // stamped when written
}

TEST_CASE("the reader detects a corrupted byte anywhere in a record", "[metrics]") {
  TempDir dir;
  std::string path;
  {
    TensorBoardWriter w(dir.path);
    path = w.path();
    for (const auto& r : sample_records()) w.write_scalars(r);
  }
  const std::string good = read_text(path);
  REQUIRE(evreader::read_records(path).size() == 5);
  const size_t first = good.find("brain.Event:2");
  REQUIRE(first != std::string::npos);
  const size_t second_record = 12 + evreader::le(good, 0, 8) + 4;

  SECTION("a byte of the data") {
    std::string bad = good;
    bad[first + 3] ^= 0x01;
    write_text(path, bad);
    CHECK_THROWS_WITH(evreader::read_records(path), Contains("record 0") && Contains("data CRC mismatch"));
  }
  SECTION("a byte of the second record's length") {
    std::string bad = good;
    bad[second_record] ^= 0x40;
    write_text(path, bad);
    CHECK_THROWS_WITH(evreader::read_records(path), Contains("record 1") && Contains("length CRC mismatch"));
  }
  SECTION("a byte of a data CRC") {
    std::string bad = good;
    bad[second_record - 1] ^= 0x80;
    write_text(path, bad);
    CHECK_THROWS_WITH(evreader::read_records(path), Contains("record 0") && Contains("data CRC mismatch"));
  }
  SECTION("a truncated last record") {
    write_text(path, good.substr(0, good.size() - 2));
    CHECK_THROWS_WITH(evreader::read_records(path), Contains("record 4") && Contains("truncated"));
  }
}

TEST_CASE("a second event file in the same directory gets a name of its own", "[metrics]") {
  TempDir dir;
  TensorBoardWriter a(dir.path), b(dir.path);
  CHECK(a.path() != b.path());
  CHECK(list_dir(dir / "tensorboard").size() == 2);
  CHECK(evreader::read_records(b.path()).size() == 1);
}

TEST_CASE("a log.dir that cannot be made is named in the error", "[metrics]") {
  TempDir dir;
  write_text(dir / "file", "x");
  CHECK_THROWS_WITH(MetricsLogger(dir / "file/logs"), Contains("log.dir") && Contains(dir / "file"));
}

TEST_CASE("json numbers: finite values round-trip, NaN and infinities become strings", "[metrics]") {
  CHECK(json_number(0.1) == "0.10000000000000001");
  CHECK(std::stod(json_number(1.0 / 3)) == 1.0 / 3);
  CHECK(json_number(5120) == "5120");
  CHECK(json_number(kNaN) == "\"NaN\"");
  CHECK(json_number(kInf) == "\"Infinity\"");
  CHECK(json_number(-kInf) == "\"-Infinity\"");
  CHECK(json_string("a\"b\\c\nd\x01") == "\"a\\\"b\\\\c\\nd\\u0001\"");
}

#if ME_TEST_HAVE_JSON
TEST_CASE("metrics.jsonl: one valid JSON object per record, with the same values", "[metrics]") {
  TempDir dir;
  const auto records = sample_records();
  {
    MetricsLogger log(dir.path);
    for (const auto& r : records) log.write(r);
  }
  {
    MetricsLogger again(dir.path);  // a resumed run appends
    again.write(records[0]);
  }
  std::ifstream f(dir / "metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(f, line);) lines.push_back(nlohmann::json::parse(line));  // throws if invalid
  REQUIRE(lines.size() == records.size() + 1);
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& want = records[i];
    const auto& got = lines[i];
    INFO("line " << i);
    CHECK(got.at("kind") == want.kind);
    CHECK(got.at("step") == want.step);
    CHECK(got.at("wall_time").get<double>() == want.wall_time);
    CHECK(got.size() == 3 + want.values.size());
    for (const auto& [k, v] : want.values) {
      INFO(k);
      if (std::isnan(v))
        CHECK(got.at(k) == "NaN");
      else
        CHECK(got.at(k).get<double>() == v);  // exact: 17 significant digits
    }
  }
  CHECK(lines.back().at("step") == records[0].step);
}
#endif
