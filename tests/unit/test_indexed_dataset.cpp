// Megatron .bin/.idx reader and writer, checked against bytes written from the format spec
// (shared/context/MEGATRON-FORMATS.md) rather than against our own writer alone.
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/data/indexed_dataset.h"
#include "tests/unit/temp_dir.h"

using namespace me::data;
using Catch::Contains;
using Bytes = std::vector<uint8_t>;
using Tokens = std::vector<int64_t>;
namespace fs = std::filesystem;

namespace {

void write_file(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(f.good());
}

Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Appends `v` as `width` little-endian bytes by shifting: independent of the host and of
// the memcpy the implementation uses.
void le(Bytes& b, int64_t v, int width) {
  for (int k = 0; k < width; ++k) b.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * k)));
}

// An .idx laid out from the spec table: magic, version, dtype, S, D, lengths, pointers, docs.
Bytes make_idx(uint8_t code, const std::vector<int32_t>& lengths, const Tokens& pointers,
               const Tokens& docs, uint64_t version = 1) {
  Bytes b = {0x4D, 0x4D, 0x49, 0x44, 0x49, 0x44, 0x58, 0x00, 0x00};
  le(b, static_cast<int64_t>(version), 8);
  b.push_back(code);
  le(b, static_cast<int64_t>(lengths.size()), 8);
  le(b, static_cast<int64_t>(docs.size()), 8);
  for (int32_t n : lengths) le(b, n, 4);
  for (int64_t p : pointers) le(b, p, 8);
  for (int64_t d : docs) le(b, d, 8);
  return b;
}

const DType kAllDTypes[] = {DType::uint8, DType::int8,    DType::int16,   DType::int32,
                            DType::int64, DType::float64, DType::float32, DType::uint16};

}  // namespace

TEST_CASE("dtype helpers follow Megatron", "[indexed]") {
  CHECK(dtype_for_vocab(50257) == DType::uint16);
  CHECK(dtype_for_vocab(32000) == DType::uint16);
  CHECK(dtype_for_vocab(65499) == DType::uint16);
  CHECK(dtype_for_vocab(65500) == DType::int32);
  CHECK(dtype_for_vocab(128256) == DType::int32);
  CHECK(dtype_size(DType::uint8) == 1);
  CHECK(dtype_size(DType::uint16) == 2);
  CHECK(dtype_size(DType::float32) == 4);
  CHECK(dtype_size(DType::float64) == 8);
  CHECK(std::string(dtype_name(DType::int16)) == "int16");
}

TEST_CASE("writer produces the exact bytes of the spec", "[indexed]") {
  TempDir dir;
  const std::string prefix = dir / "golden";
  {
    IndexedDatasetWriter w(prefix, DType::uint16);
    w.add_sequence(Tokens{1, 2, 3});
    w.add_sequence(Tokens{4, 5});
    w.end_document();
    w.add_sequence(Tokens{6});
    w.end_document();
    w.finalize();
  }
  const Bytes idx = {
      0x4D, 0x4D, 0x49, 0x44, 0x49, 0x44, 0x58, 0x00, 0x00,  // magic MMIDIDX\0\0
      0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // version 1
      0x08,                                                  // dtype code 8: uint16
      0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // 3 sequences
      0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // 3 document index entries
      0x03, 0x00, 0x00, 0x00,                                // lengths (int32): 3
      0x02, 0x00, 0x00, 0x00,                                //   2
      0x01, 0x00, 0x00, 0x00,                                //   1
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // pointers (int64): 0
      0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        //   6
      0x0A, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        //   10
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        // document index (int64): 0
      0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        //   2
      0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        //   3
  };
  const Bytes bin = {1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0};
  CHECK(read_file(prefix + ".idx") == idx);
  CHECK(read_file(prefix + ".bin") == bin);
  CHECK_FALSE(fs::exists(prefix + ".idx.tmp"));
  CHECK_FALSE(fs::exists(prefix + ".bin.tmp"));
}

TEST_CASE("reader reads files built byte by byte from the spec", "[indexed]") {
  TempDir dir;
  SECTION("uint16") {
    const std::string prefix = dir / "u16";
    // Sequences [7, 65535, 0] and [300, 1]; two documents of one sequence each.
    write_file(prefix + ".idx", make_idx(8, {3, 2}, {0, 6}, {0, 1, 2}));
    write_file(prefix + ".bin", {7, 0, 0xFF, 0xFF, 0, 0, 0x2C, 0x01, 1, 0});
    IndexedDataset ds(prefix);
    CHECK(ds.dtype() == DType::uint16);
    CHECK(ds.size() == 2);
    CHECK(ds.documents() == 2);
    CHECK(ds.document_index() == Tokens{0, 1, 2});
    CHECK(ds.length(0) == 3);
    CHECK(ds.length(1) == 2);
    CHECK(ds.get(0) == Tokens{7, 65535, 0});
    CHECK(ds.get(1) == Tokens{300, 1});
    CHECK(ds.get(0, 1, 1) == Tokens{65535});
    CHECK(ds.get(0, 1) == Tokens{65535, 0});
    CHECK(ds.get(0, 3).empty());
    uint16_t raw;
    std::memcpy(&raw, ds.data(1, 1), 2);
    CHECK(raw == 1);
  }
  SECTION("int32, with an empty sequence and a document of several sequences") {
    const std::string prefix = dir / "i32";
    // Sequences [-5, 128256, 2147483647], [], [42]; documents {0, 1} and {2}.
    write_file(prefix + ".idx", make_idx(4, {3, 0, 1}, {0, 12, 12}, {0, 2, 3}));
    Bytes bin;
    for (int64_t v : {int64_t{-5}, int64_t{128256}, int64_t{2147483647}, int64_t{42}}) le(bin, v, 4);
    write_file(prefix + ".bin", bin);
    IndexedDataset ds(prefix);
    CHECK(ds.dtype() == DType::int32);
    CHECK(ds.size() == 3);
    CHECK(ds.documents() == 2);
    CHECK(ds.get(0) == Tokens{-5, 128256, 2147483647});
    CHECK(ds.get(1).empty());
    CHECK(ds.get(2) == Tokens{42});
    CHECK(ds.get(0, 1, 2) == Tokens{128256, 2147483647});
    CHECK(ds.get(0, 0, 1) == Tokens{-5});
  }
}

TEST_CASE("round trip for every dtype at its extremes", "[indexed]") {
  TempDir dir;
  for (DType t : kAllDTypes) {
    INFO("dtype " << dtype_name(t));
    // The representable range: the integer limits, or the gap-free integers of a float.
    int64_t lo = 0, hi = 0;
    switch (t) {
      case DType::uint8: lo = 0, hi = 255; break;
      case DType::int8: lo = -128, hi = 127; break;
      case DType::int16: lo = -32768, hi = 32767; break;
      case DType::int32: lo = INT32_MIN, hi = INT32_MAX; break;
      case DType::int64: lo = INT64_MIN, hi = INT64_MAX; break;
      case DType::float64: lo = -(int64_t{1} << 53), hi = int64_t{1} << 53; break;
      case DType::float32: lo = -(int64_t{1} << 24), hi = int64_t{1} << 24; break;
      case DType::uint16: lo = 0, hi = 65535; break;
    }
    std::mt19937_64 rng(static_cast<uint64_t>(t));
    std::uniform_int_distribution<int64_t> value(lo, hi);
    std::uniform_int_distribution<size_t> len(0, 40);
    std::bernoulli_distribution doc_ends(0.3);

    const std::string prefix = dir / dtype_name(t);
    std::vector<Tokens> seqs;
    Tokens docs = {0};
    {
      IndexedDatasetWriter w(prefix, t);
      w.add_sequence(Tokens{lo, hi, 0, lo, hi});
      seqs.push_back({lo, hi, 0, lo, hi});
      for (int i = 0; i < 300; ++i) {
        Tokens s(len(rng));
        for (auto& v : s) v = value(rng);
        w.add_sequence(s);
        seqs.push_back(s);
        if (doc_ends(rng)) {
          w.end_document();
          docs.push_back(static_cast<int64_t>(seqs.size()));
        }
      }
      w.add_sequence(Tokens{hi});  // left open: finalize() closes the last document
      seqs.push_back({hi});
      docs.push_back(static_cast<int64_t>(seqs.size()));
      w.finalize();
    }
    IndexedDataset ds(prefix);
    REQUIRE(ds.dtype() == t);
    REQUIRE(ds.size() == seqs.size());
    CHECK(ds.document_index() == docs);
    CHECK(ds.documents() == docs.size() - 1);
    size_t total = 0;
    const auto* base = static_cast<const char*>(ds.data(0));
    for (size_t i = 0; i < seqs.size(); ++i) {
      CHECK(ds.length(i) == static_cast<int32_t>(seqs[i].size()));
      CHECK(ds.get(i) == seqs[i]);
      // Pointers are cumulative: each sequence starts where the previous one ended.
      CHECK(static_cast<const char*>(ds.data(i)) - base ==
            static_cast<std::ptrdiff_t>(total * dtype_size(t)));
      total += seqs[i].size();
      if (seqs[i].size() >= 3) CHECK(ds.get(i, 1, 2) == Tokens(seqs[i].begin() + 1, seqs[i].begin() + 3));
    }
    CHECK(fs::file_size(prefix + ".bin") == total * dtype_size(t));
    CHECK(fs::file_size(prefix + ".idx") == 34 + 12 * seqs.size() + 8 * docs.size());
  }
}

TEST_CASE("an empty dataset round trips", "[indexed]") {
  TempDir dir;
  const std::string prefix = dir / "empty";
  IndexedDatasetWriter(prefix, DType::uint16).finalize();
  IndexedDataset ds(prefix);
  CHECK(ds.size() == 0);
  CHECK(ds.documents() == 0);
  CHECK(ds.document_index() == Tokens{0});
}

TEST_CASE("corrupt or missing files are clear errors naming the file", "[indexed]") {
  TempDir dir;
  const std::string p = dir / "bad";
  const std::string idx = p + ".idx", bin = p + ".bin";
  // A valid uint16 dataset: sequences of 3, 2 and 1 tokens, documents {0, 1} and {2}.
  const Bytes good_bin = {1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0};
  auto write = [&](const Bytes& i, const Bytes& b) {
    write_file(idx, i);
    write_file(bin, b);
  };
  write(make_idx(8, {3, 2, 1}, {0, 6, 10}, {0, 2, 3}), good_bin);
  REQUIRE(IndexedDataset(p).get(2) == Tokens{6});

  SECTION("missing .idx") {
    const std::string q = dir / "nothing";
    REQUIRE_THROWS_WITH(IndexedDataset(q), "cannot open '" + q + ".idx': No such file or directory");
  }
  SECTION("a file name where the prefix belongs") {
    REQUIRE_THROWS_WITH(IndexedDataset(bin), Contains("cannot open '" + bin + ".idx'") &&
                                                 Contains("without the .bin extension"));
  }
  SECTION("missing .bin") {
    fs::remove(bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), "cannot open '" + bin + "': No such file or directory");
  }
  SECTION("wrong magic") {
    Bytes b = make_idx(8, {3, 2, 1}, {0, 6, 10}, {0, 2, 3});
    b[0] = 'X';
    write(b, good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains("MMIDIDX") &&
                                                Contains("not a Megatron .idx"));
  }
  SECTION("unsupported version") {
    write(make_idx(8, {3, 2, 1}, {0, 6, 10}, {0, 2, 3}, 2), good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains("version 2") &&
                                                Contains("only version 1"));
  }
  SECTION("unknown dtype code") {
    for (uint8_t code : {uint8_t{0}, uint8_t{9}, uint8_t{255}}) {
      write(make_idx(code, {3, 2, 1}, {0, 6, 10}, {0, 2, 3}), good_bin);
      REQUIRE_THROWS_WITH(IndexedDataset(p),
                          Contains(idx) && Contains("unknown dtype code " + std::to_string(code)) &&
                              Contains("1 uint8") && Contains("8 uint16"));
    }
  }
  SECTION("truncated .idx") {
    Bytes b = make_idx(8, {3, 2, 1}, {0, 6, 10}, {0, 2, 3});
    write(Bytes(b.begin(), b.end() - 1), good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains("truncated") &&
                                                Contains("93 bytes") && Contains("need 94"));
    write(Bytes(b.begin(), b.begin() + 20), good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains("truncated"));
    write(Bytes(b.begin(), b.begin() + 4), good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains("truncated"));
    // Counts so large that the size they imply overflows 64 bits.
    b = make_idx(8, {}, {}, {0});
    for (int k = 18; k < 26; ++k) b[k] = 0xFF;
    write(b, good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains("more than 2^64"));
  }
  SECTION(".bin shorter than the index says") {
    write(make_idx(8, {3, 2, 1}, {0, 6, 10}, {0, 2, 3}), Bytes(good_bin.begin(), good_bin.end() - 1));
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(bin) && Contains("truncated") &&
                                                Contains("11 bytes") && Contains("sequence 2"));
  }
  SECTION("a corrupt pointer in the middle is found at open") {
    write(make_idx(8, {3, 2, 1}, {0, 1000, 10}, {0, 2, 3}), good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains(bin) && Contains("sequence 1 at byte 1000") &&
                                                Contains("end at byte 6"));
  }
  // Issue 38, item 11: every length is checked at open, not only the last one (a negative
  // length in the middle trained silently; one at the start ended in std::bad_alloc).
  SECTION("a negative length anywhere") {
    write(make_idx(8, {3, -2, 1}, {0, 6, 10}, {0, 2, 3}), good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains("sequence 1 the negative length -2"));
    write(make_idx(8, {-3, 2, 1}, {0, 6, 10}, {0, 2, 3}), good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains("sequence 0 the negative length -3"));
  }
  SECTION("overlapping sequences") {  // lengths that do not match the pointers
    write(make_idx(8, {3, 3, 0}, {0, 4, 10}, {0, 2, 3}), good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains("sequence 1 at byte 4") &&
                                                Contains("without gaps or overlaps"));
  }
  SECTION("the index of a smaller dataset over a bigger .bin") {
    write(make_idx(8, {3, 2}, {0, 6}, {0, 2}), good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(bin) && Contains(idx) && Contains("is 12 bytes") &&
                                                Contains("hold 10 bytes") && Contains("does not belong"));
  }
  SECTION("document index not non-decreasing") {
    write(make_idx(8, {3, 2, 1}, {0, 6, 10}, {0, 2, 1, 3}), good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains("not non-decreasing"));
  }
  SECTION("document index not ending at the sequence count") {
    write(make_idx(8, {3, 2, 1}, {0, 6, 10}, {0, 2}), good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains("does not end at the sequence count"));
  }
  SECTION("document index not starting at 0, or empty") {
    write(make_idx(8, {3, 2, 1}, {0, 6, 10}, {1, 2, 3}), good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains("instead of 0"));
    write(make_idx(8, {3, 2, 1}, {0, 6, 10}, {}), good_bin);
    REQUIRE_THROWS_WITH(IndexedDataset(p), Contains(idx) && Contains("empty document index"));
  }
  SECTION("out-of-range sequence or slice") {
    IndexedDataset ds(p);
    REQUIRE_THROWS_WITH(ds.get(3), Contains(bin) && Contains("sequence 3 is out of range") &&
                                       Contains("holds 3 sequences"));
    REQUIRE_THROWS_WITH(ds.data(3), Contains(bin) && Contains("out of range"));
    REQUIRE_THROWS_WITH(ds.length(7), Contains(bin) && Contains("out of range"));
    REQUIRE_THROWS_WITH(ds.get(0, 4), Contains(bin) && Contains("offset 4 is past the end"));
    REQUIRE_THROWS_WITH(ds.data(0, 4), Contains(bin) && Contains("offset 4 is past the end"));
    REQUIRE_THROWS_WITH(ds.get(0, 1, 3), Contains(bin) && Contains("slice of 3 tokens at offset 1"));
    CHECK(ds.get(0, 1, 2) == Tokens{2, 3});
  }
}

TEST_CASE("writer rejects values that do not fit the dtype", "[indexed]") {
  TempDir dir;
  const std::string prefix = dir / "range";
  IndexedDatasetWriter w(prefix, DType::uint16);
  w.add_sequence(Tokens{1, 2});
  REQUIRE_THROWS_WITH(w.add_sequence(Tokens{5, 65536}),
                      Contains("token 65536") && Contains("uint16") && Contains(prefix));
  REQUIRE_THROWS_WITH(w.add_sequence(Tokens{-1}), Contains("token -1") && Contains("uint16"));
  w.add_sequence(Tokens{65535});  // the rejected sequences left nothing behind
  w.finalize();
  IndexedDataset ds(prefix);
  REQUIRE(ds.size() == 2);
  CHECK(ds.get(1) == Tokens{65535});
  CHECK(fs::file_size(prefix + ".bin") == 6);

  IndexedDatasetWriter i8(dir / "i8", DType::int8);
  REQUIRE_THROWS_WITH(i8.add_sequence(Tokens{128}), Contains("token 128") && Contains("int8"));
  IndexedDatasetWriter f32(dir / "f32", DType::float32);
  REQUIRE_THROWS_WITH(f32.add_sequence(Tokens{(1 << 24) + 1}),
                      Contains("token 16777217") && Contains("float32"));
  IndexedDatasetWriter i32(dir / "i32", DType::int32);
  REQUIRE_THROWS_WITH(i32.add_sequence(Tokens{int64_t{1} << 31}),
                      Contains("token 2147483648") && Contains("int32"));
}

TEST_CASE("an unfinished writer never replaces an existing dataset", "[indexed]") {
  TempDir dir;
  const std::string prefix = dir / "keep";
  {
    IndexedDatasetWriter w(prefix, DType::uint16);
    w.add_sequence(Tokens{10, 20});
    w.finalize();
  }
  const Bytes old_idx = read_file(prefix + ".idx"), old_bin = read_file(prefix + ".bin");
  {
    IndexedDatasetWriter w(prefix, DType::int32);
    w.add_sequence(Tokens{1, 2, 3, 4});
    w.end_document();
    // While writing, only the .tmp file exists next to the untouched dataset.
    CHECK(fs::exists(prefix + ".bin.tmp"));
    CHECK(read_file(prefix + ".bin") == old_bin);
    CHECK_THROWS(w.add_sequence(Tokens{int64_t{1} << 40}));
  }  // destroyed without finalize(), as when an exception unwinds the preprocessing
  CHECK(read_file(prefix + ".idx") == old_idx);
  CHECK(read_file(prefix + ".bin") == old_bin);
  CHECK_FALSE(fs::exists(prefix + ".bin.tmp"));
  CHECK_FALSE(fs::exists(prefix + ".idx.tmp"));
  CHECK(IndexedDataset(prefix).get(0) == Tokens{10, 20});

  // finalize() is once only, and a finished writer takes no more sequences.
  IndexedDatasetWriter w(dir / "once", DType::uint8);
  w.finalize();
  CHECK_THROWS_WITH(w.finalize(), Contains("already finalized"));
  CHECK_THROWS_WITH(w.add_sequence(Tokens{1}), Contains("already finalized"));
}

TEST_CASE("writer reports a directory it cannot create files in", "[indexed]") {
  TempDir dir;
  const std::string prefix = dir / "no/such/dir/x";
  REQUIRE_THROWS_WITH(IndexedDatasetWriter(prefix, DType::uint16),
                      "cannot create '" + prefix + ".bin.tmp': No such file or directory");
}
