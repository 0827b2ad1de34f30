// Checkpoint files without LibTorch: CRC-32C, safetensors written and read back (and read by
// an independent parse of the bytes), every kind of damaged header refused with the file
// named, the directory's atomic commit, leftovers, keep, and the metadata's version check.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/metadata.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/core/crc32c.h"
#include "temp_dir.h"
#include "test_assets.h"  // slurp, spit

using namespace me::checkpoint;

namespace {

// A file whose 8-byte length prefix and JSON header are ours to choose, then `data`.
std::string forged(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + data;
}

}  // namespace

TEST_CASE("CRC-32C matches the standard check value and continues across pieces", "[checkpoint]") {
  const std::string s = "123456789";
  CHECK(me::crc32c(0, s.data(), s.size()) == 0xE3069283u);  // RFC 3720's check value
  std::string big(100003, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  const uint32_t whole = me::crc32c(0, big.data(), big.size());
  const uint32_t split = me::crc32c(me::crc32c(0, big.data(), 12345), big.data() + 12345, big.size() - 12345);
  CHECK(whole == split);
}

TEST_CASE("safetensors round trip, read back by an independent parse of the bytes", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.path + "/a.safetensors";
  std::vector<float> w = {1.5f, -2.0f, 3.25f, 4.0f, 5.0f, 6.0f};
  std::vector<int64_t> ids = {7, -8, 9};
  const auto r = write_safetensors(path, {{"w", DType::F32, {2, 3}, w.data()}, {"ids", DType::I64, {3}, ids.data()}},
                                   {{"format", "test"}});
  const std::string bytes = slurp(path);
  REQUIRE(bytes.size() == r.bytes);
  CHECK(me::crc32c(0, bytes.data(), bytes.size()) == r.crc32c);
  // Independently: the length prefix, an aligned data start, and the raw floats where the
  // header says.
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[static_cast<size_t>(i)])) << (8 * i);
  CHECK((8 + n) % 8 == 0);
  const std::string header = bytes.substr(8, n);
  CHECK(header.find("\"w\":{\"data_offsets\":[0,24],\"dtype\":\"F32\",\"shape\":[2,3]}") != std::string::npos);
  float second;
  std::memcpy(&second, bytes.data() + 8 + n + 4, 4);
  CHECK(second == -2.0f);

  SafetensorsFile f(path);
  CHECK(f.metadata().at("format") == "test");
  const auto& e = f.at("w");
  CHECK(e.shape == std::vector<int64_t>{2, 3});
  std::vector<float> back(6);
  f.read(e, back.data());
  CHECK(back == w);
  std::vector<int64_t> ids_back(3);
  f.read(f.at("ids"), ids_back.data());
  CHECK(ids_back == ids);
  CHECK(f.crc32c() == r.crc32c);
  CHECK_THROWS_WITH(f.at("nope"), Catch::Contains("has no tensor 'nope'"));
}

TEST_CASE("damaged safetensors files are refused, naming the file and the tensor", "[checkpoint]") {
  TempDir dir;
  const std::string path = dir.path + "/bad.safetensors";
  const std::string data(16, 'x');
  auto opening = [&](const std::string& bytes) {
    spit(path, bytes);
    return [&] { SafetensorsFile f(path); };
  };
  CHECK_THROWS_WITH(opening("abc")(), Catch::Contains("bad.safetensors' is truncated"));
  CHECK_THROWS_WITH(opening(forged("{", data))(), Catch::Contains("its header is not JSON"));
  std::string huge = forged("{}", "");
  huge[5] = 1;  // a header length of 2^40
  CHECK_THROWS_WITH(opening(huge)(), Catch::Contains("its header claims"));
  CHECK_THROWS_WITH(opening(forged(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,64]}})", data))(),
                    Catch::Contains("tensor 't': its bytes [0, 64) lie past the end of the file's 16 data bytes"));
  // issue 38, item 15: reversed offsets were reported as "past the end"
  CHECK_THROWS_WITH(opening(forged(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data))(),
                    Catch::Contains("tensor 't': data_offsets [8, 0] are reversed"));
  CHECK_THROWS_WITH(opening(forged(R"({"t":{"dtype":"Q7","shape":[4],"data_offsets":[0,16]}})", data))(),
                    Catch::Contains("tensor 't': dtype 'Q7' cannot be read"));
  CHECK_THROWS_WITH(opening(forged(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data))(),
                    Catch::Contains("shape and dtype make 3 x 4 bytes, its range holds 16"));
  CHECK_THROWS_WITH(opening(forged(R"({"t":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", data))(),
                    Catch::Contains("negative dimension"));
  CHECK_THROWS_WITH(opening(forged(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", data))(),
                    Catch::Contains("overlap"));
  CHECK_THROWS_WITH(opening(forged(R"({"t":{"dtype":"F32","shape":[4]}})", data))(),
                    Catch::Contains("expected {dtype, shape, data_offsets}"));
  CHECK_THROWS_WITH(SafetensorsFile(dir.path + "/missing.safetensors"), Catch::Contains("cannot open checkpoint shard"));
}

TEST_CASE("a checkpoint directory commits atomically, cleans leftovers and keeps the newest", "[checkpoint]") {
  TempDir root;
  const std::string d = root.path + "/ckpt";
  CheckpointDir dir(d);
  CHECK_FALSE(dir.latest());
  for (int64_t it : {10, 20, 30}) {
    const auto tmp = dir.begin(it, "n" + std::to_string(it));
    CHECK(tmp == d + "/iter_00000" + std::to_string(it) + ".tmp-n" + std::to_string(it));
    write_file_atomic(tmp + "/" + kMetadataFile, "{}");
    // Before the commit the tracker still names the previous iteration.
    CHECK(dir.latest() == (it == 10 ? std::optional<int64_t>() : std::optional<int64_t>(it - 10)));
    CHECK(dir.commit(it, tmp));
    CHECK(dir.latest() == it);
  }
  CHECK(slurp(d + "/" + kTrackerFile) == "30\n");
  CHECK_FALSE(dir.commit(30, dir.begin(30, "again")));  // never over a committed iteration
  CHECK(dir.remove_leftovers() == std::vector<std::string>{"iter_0000030.tmp-again"});
  CHECK(dir.committed() == std::vector<int64_t>{10, 20, 30});
  CHECK(dir.prune(2) == std::vector<int64_t>{10});
  CHECK(dir.committed() == std::vector<int64_t>{20, 30});
  CHECK(resolve_iteration_dir(d) == d + "/iter_0000030");
  CHECK(resolve_iteration_dir(d + "/iter_0000020") == d + "/iter_0000020");
  spit(d + "/" + kTrackerFile, "40\n");
  CHECK_THROWS_WITH(dir.latest(), Catch::Contains("names iteration 40, but") && Catch::Contains("does not exist"));
  spit(d + "/" + kTrackerFile, "4o\n");
  CHECK_THROWS_WITH(dir.latest(), Catch::Contains("does not hold an iteration number"));
  // issue 38, item 15: Megatron's "release" tracker names the release/ directory
  spit(d + "/" + kTrackerFile, "release\n");
  CHECK_THROWS_WITH(dir.latest(), Catch::Contains("names the release, but " + d + "/release does not exist"));
  std::filesystem::create_directories(d + "/release");
  write_file_atomic(d + "/release/" + kMetadataFile, "{}");
  CHECK(dir.latest() == kReleaseIteration);
  CHECK(resolve_iteration_dir(d) == d + "/release");
  CHECK_THROWS_WITH(resolve_iteration_dir(root.path), Catch::Contains("is not a checkpoint"));
}

TEST_CASE("checkpoint metadata round-trips and refuses a newer format", "[checkpoint]") {
  Metadata m;
  m.iteration = 7;
  m.consumed_samples = 56;
  m.layout.tp = 2;
  m.layout.stage_layers = {1, 1};
  m.tensors["model.x"] = {"F32", {4, 2}, {{"rank_00000.safetensors", "model.x", 0, 0, 2, 0, 4}}};
  m.shards["rank_00000.safetensors"] = {0, 100, 0xdeadbeef};
  const auto back = Metadata::parse(m.to_json(), "m.json");
  CHECK(back.iteration == 7);
  CHECK(back.layout.stage_layers == std::vector<int64_t>{1, 1});
  CHECK(back.tensors.at("model.x").pieces.at(0).length == 2);
  CHECK(back.shards.at("rank_00000.safetensors").crc32c == 0xdeadbeefu);
  std::string newer = m.to_json();
  newer.replace(newer.find("\"version\": 1"), 12, "\"version\": 99");
  CHECK_THROWS_WITH(Metadata::parse(newer, "m.json"), Catch::Contains("format version 99, newer than this megaengine reads (1)"));
  CHECK_THROWS_WITH(Metadata::parse("{\"format\":\"other\"}", "m.json"), Catch::Contains("is not a megaengine checkpoint"));
  // issue 38, item 15: a type error names the field (nlohmann's message alone does not)
  std::string typed = m.to_json();
  typed.replace(typed.find("\"tp\": 2"), 7, "\"tp\": \"2\"");
  CHECK_THROWS_WITH(Metadata::parse(typed, "m.json"), Catch::Contains("'m.json': field 'layout.tp' has type string, expected an integer"));
  std::string piece = m.to_json();
  piece.replace(piece.find("\"flat_length\": 4"), 16, "\"flat_length\": true");
  CHECK_THROWS_WITH(Metadata::parse(piece, "m.json"),
                    Catch::Contains("field 'tensors.model.x.pieces[0].flat_length' has type boolean, expected an integer"));
}
