// GPT-2 BPE tokenizer, checked against golden r50k_base encodings from gpt-tokenizer's
// TestPlans.txt (not against our own output), plus round trips, threads and error messages.
// Needs the assets from scripts/fetch_assets.sh, in $ME_ASSET_DIR or <repo>/assets.
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <array>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/utf8.h"
#include "engine/data/gpt2_tokenizer.h"
#include "test_assets.h"

using me::data::GPT2Tokenizer;
using Catch::Contains;
using Ids = std::vector<int64_t>;
namespace fs = std::filesystem;

namespace {

std::string repeat_fffd(size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += "\xef\xbf\xbd";
  return out;
}

const GPT2Tokenizer& tokenizer() {
  static const GPT2Tokenizer tok(asset("gpt2-encoder.json"), asset("gpt2-vocab.bpe"));
  return tok;
}

struct Case {
  std::string encoding, sample;
  Ids ids;
};

// Blocks of "EncodingName: <name>\nSample: <text>\nEncoded: [<ids>]\n", separated by blank lines.
// The sample is everything between "Sample: " and the block's "\nEncoded: ", so it may hold newlines.
std::vector<Case> parse_test_plans(const std::string& text) {
  static const std::string kName = "EncodingName: ", kSample = "\nSample: ", kEncoded = "\nEncoded: [";
  std::vector<Case> cases;
  size_t pos = text.find(kName);
  while (pos != std::string::npos) {
    size_t next = text.find("\n" + kName, pos);
    const std::string block = text.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    Case c;
    const size_t name_end = block.find('\n');
    REQUIRE(name_end != std::string::npos);
    c.encoding = block.substr(kName.size(), name_end - kName.size());
    const size_t s = block.find(kSample);
    const size_t e = block.rfind(kEncoded);
    REQUIRE(s == name_end);
    REQUIRE(e != std::string::npos);
    REQUIRE(e >= s + kSample.size());
    c.sample = block.substr(s + kSample.size(), e - s - kSample.size());
    const size_t close = block.find(']', e);
    REQUIRE(close != std::string::npos);
    const std::string list = block.substr(e + kEncoded.size(), close - e - kEncoded.size());
    size_t i = 0;
    while (i < list.size()) {
      while (i < list.size() && (list[i] == ' ' || list[i] == ',')) ++i;
      if (i >= list.size()) break;
      size_t used = 0;
      c.ids.push_back(std::stoll(list.substr(i), &used));
      REQUIRE(used > 0);
      i += used;
    }
    cases.push_back(std::move(c));
    pos = next == std::string::npos ? next : next + 1;
  }
  return cases;
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/me_gpt2_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& content) const {
    const std::string p = path + "/" + name;
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }
};

}  // namespace

TEST_CASE("gpt2 tokenizer: vocabulary and special ids", "[gpt2]") {
  const auto& tok = tokenizer();
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.eod() == 50256);
  CHECK(tok.decode({tok.eod()}) == "<|endoftext|>");
  CHECK(tok.decode({0}) == "!");
  CHECK(tok.decode({256}) == " t");
  CHECK(tok.decode({220}) == " ");
}

TEST_CASE("gpt2 tokenizer: hand cases", "[gpt2]") {
  const auto& tok = tokenizer();
  CHECK(tok.encode("") == Ids{});
  CHECK(tok.encode("hello world") == Ids{31373, 995});
  CHECK(tok.encode("Hello world") == Ids{15496, 995});
  CHECK(tok.encode(" hello") == Ids{23748});
  CHECK(tok.encode("  hello") == Ids{220, 23748});  // \s+(?!\S) leaves the last space to the word
  CHECK(tok.encode("hello\n\nworld") == Ids{31373, 198, 198, 6894});
  CHECK(tok.decode({31373, 995}) == "hello world");
  // "<|endoftext|>" in text is plain text, never the special id.
  const Ids eot = tok.encode("<|endoftext|>");
  CHECK(eot.size() > 1);
  for (auto id : eot) CHECK(id != tok.eod());
  CHECK(tok.decode(eot) == "<|endoftext|>");
  // encode_into appends.
  Ids out{tok.eod()};
  tok.encode_into("hello world", out);
  CHECK(out == Ids{50256, 31373, 995});
}

TEST_CASE("gpt2 tokenizer: all r50k_base cases of gpt-tokenizer's TestPlans.txt", "[gpt2]") {
  const auto& tok = tokenizer();
  const auto cases = parse_test_plans(slurp(asset("gpt2-testplans.txt")));
  int r50k = 0;
  for (const auto& c : cases) {
    if (c.encoding != "r50k_base") continue;
    ++r50k;
    INFO("case " << r50k << ", sample: '" << c.sample << "'");
    CHECK(tok.encode(c.sample) == c.ids);
    CHECK(tok.decode(c.ids) == c.sample);
  }
  CHECK(r50k == 64);
}

TEST_CASE("gpt2 tokenizer: decode(encode(x)) == x on Moby Dick and on invalid UTF-8", "[gpt2]") {
  const auto& tok = tokenizer();
  const std::string text = slurp(asset("moby-dick.txt"));
  const Ids ids = tok.encode(text);
  CHECK(ids.size() > 200000);
  CHECK(ids.size() < 400000);
  CHECK(tok.decode(ids) == text);
  // Again, now from the cache: the same ids.
  CHECK(tok.encode(text) == ids);

  // Not valid UTF-8 (GPT-2 never sees it): still a round trip of the bytes, bytes as their own
  // pieces; decode repairs them as Python's errors="replace" does (one U+FFFD a maximal subpart).
  const std::string bad = std::string("ab\xff\xfe cd \x80 caf\xc3") + "\xa9 \xe2\x82 end\xf0";
  CHECK(tok.decode_bytes(tok.encode(bad)) == bad);
  const std::string R = "\xef\xbf\xbd";
  CHECK(tok.decode(tok.encode(bad)) == "ab" + R + R + " cd " + R + " caf\xc3\xa9 " + R + " end" + R);
  CHECK(tok.encode(std::string("\xff")) == Ids{tok.encode("\xff").at(0)});
  // Controls, NEL, NBSP, CJK and emoji round-trip too.
  const std::string odd = "\t\x01\x7f x\xc2\x85y\xc2\xa0z \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80  \n ";
  CHECK(tok.decode(tok.encode(odd)) == odd);
}

TEST_CASE("gpt2 tokenizer: decode is valid UTF-8 when tokens split a character", "[gpt2]") {
  const auto& tok = tokenizer();
  const std::string R = "\xef\xbf\xbd";
  // GPT-2 spells an emoji and many CJK characters with several byte-level tokens.
  const std::string emoji = "\xf0\x9f\x98\x80", han = "\xe4\xb8\xad";
  const Ids e = tok.encode(emoji), h = tok.encode(" " + han + han);
  REQUIRE(e.size() >= 2);
  CHECK(tok.decode(e) == emoji);
  const std::string head = tok.decode_bytes({e[0]});
  CHECK(emoji.compare(0, head.size(), head) == 0);  // a strict prefix of the character's bytes
  CHECK(head.size() < emoji.size());
  CHECK(tok.decode({e[0]}) == R);                   // an incomplete character: one U+FFFD
  CHECK(tok.decode({e.back()}) == repeat_fffd(tok.decode_bytes({e.back()}).size()));  // stray continuation bytes
  // A sample cut anywhere decodes to valid UTF-8 and keeps every whole character.
  for (size_t n = 0; n <= h.size(); ++n) {
    const std::string text = tok.decode(Ids(h.begin(), h.begin() + static_cast<long>(n)));
    CHECK(me::utf8::is_valid(text));
  }
  CHECK(tok.decode(h) == " " + han + han);
}

TEST_CASE("gpt2 tokenizer: encode from several threads gives the single-thread ids", "[gpt2]") {
  const GPT2Tokenizer tok(asset("gpt2-encoder.json"), asset("gpt2-vocab.bpe"));  // cold cache
  const std::string text = slurp(asset("moby-dick.txt")).substr(0, 400000);
  std::vector<std::string> lines;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    end = end == std::string::npos ? text.size() : end + 1;
    lines.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  constexpr int kThreads = 4;
  std::vector<std::vector<Ids>> got(kThreads, std::vector<Ids>(lines.size()));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < lines.size(); ++i) {
        const size_t k = (i + static_cast<size_t>(t) * 997) % lines.size();  // different orders
        got[static_cast<size_t>(t)][k] = tok.encode(lines[k]);
      }
    });
  for (auto& th : threads) th.join();
  const GPT2Tokenizer fresh(asset("gpt2-encoder.json"), asset("gpt2-vocab.bpe"));
  for (size_t i = 0; i < lines.size(); ++i) {
    const Ids want = fresh.encode(lines[i]);
    for (int t = 0; t < kThreads; ++t) REQUIRE(got[static_cast<size_t>(t)][i] == want);
  }
}

TEST_CASE("gpt2 tokenizer: clear errors for missing or malformed files", "[gpt2]") {
  const std::string enc = asset("gpt2-encoder.json"), bpe = asset("gpt2-vocab.bpe");
  TempDir dir;
  const std::string nowhere = dir.path + "/nope.json";
  CHECK_THROWS_WITH(GPT2Tokenizer(nowhere, bpe),
                    Contains("cannot open GPT-2 encoder.json") && Contains(nowhere) && Contains("No such file"));
  CHECK_THROWS_WITH(GPT2Tokenizer(enc, dir.path + "/nope.bpe"),
                    Contains("cannot open GPT-2 vocab.bpe") && Contains(dir.path + "/nope.bpe"));

  const std::string bad_json = dir.write("bad.json", "{\"a\": 0, \"b\": ");
  CHECK_THROWS_WITH(GPT2Tokenizer(bad_json, bpe), Contains(bad_json) && Contains("not valid JSON"));
  const std::string not_object = dir.write("list.json", "[1, 2, 3]");
  CHECK_THROWS_WITH(GPT2Tokenizer(not_object, bpe), Contains(not_object) && Contains("JSON object"));
  const std::string string_id = dir.write("strid.json", "{\"a\": \"zero\"}");
  CHECK_THROWS_WITH(GPT2Tokenizer(string_id, bpe), Contains(string_id) && Contains("not an integer"));
  const std::string few_bytes = dir.write("few.json", "{\"a\": 0, \"<|endoftext|>\": 1}");
  CHECK_THROWS_WITH(GPT2Tokenizer(few_bytes, bpe), Contains(few_bytes) && Contains("no token for byte"));
  const std::string dup = dir.write("dup.json", "{\"a\": 0, \"b\": 0}");
  CHECK_THROWS_WITH(GPT2Tokenizer(dup, bpe), Contains(dup) && Contains("more than one token"));

  // encoder.json given as vocab.bpe: its one line is no merge.
  CHECK_THROWS_WITH(GPT2Tokenizer(enc, enc), Contains(enc) && Contains("line 1") && Contains("expected a merge"));
  const std::string bad_bpe = dir.write("bad.bpe", "#version: 0.2\n\xc4\xa0 t\nnot-a-merge\n");
  CHECK_THROWS_WITH(GPT2Tokenizer(enc, bad_bpe), Contains(bad_bpe) && Contains("line 3"));
  const std::string unknown = dir.write("unknown.bpe", "#version: 0.2\nzzzzqq zzzzqq\n");
  CHECK_THROWS_WITH(GPT2Tokenizer(enc, unknown), Contains(unknown) && Contains("line 2") &&
                                                      Contains("encoder.json does not have"));

  CHECK_THROWS_AS(tokenizer().decode({50257}), me::Error);
  CHECK_THROWS_WITH(tokenizer().decode({1, -1}), Contains("id -1"));
}

// Not run by default: `test_binary "[.bench]"` prints single-thread encode throughput on Moby Dick.
TEST_CASE("gpt2 tokenizer: encode throughput on Moby Dick", "[.bench]") {
  const std::string text = slurp(asset("moby-dick.txt"));
  const GPT2Tokenizer tok(asset("gpt2-encoder.json"), asset("gpt2-vocab.bpe"));
  const double mb = static_cast<double>(text.size()) / 1e6;
  for (const char* pass : {"cold cache", "warm cache"}) {
    const auto t0 = std::chrono::steady_clock::now();
    const Ids ids = tok.encode(text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("gpt2 encode, %s: %.2f MB, %zu tokens, %.3f s, %.2f MB/s\n", pass, mb, ids.size(), s, mb / s);
  }
}

// ---- long pieces (issue 38, item 21) --------------------------------------------------------
// A run of letters without spaces is one regex piece; the merges used to cost O(n) per distinct
// merge (1 MB in 48 s). Checked against a straight port of OpenAI's encoder.py bpe(), on strings.
namespace {

struct ReferenceBpe {
  std::map<std::pair<std::string, std::string>, int> ranks;
  std::map<std::string, int64_t> encoder;
  std::array<std::string, 256> byte_char;

  ReferenceBpe() {
    // encoder.py's bytes_to_unicode(): printable bytes stand for themselves, the rest 256 + k.
    int k = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const int cp = printable ? b : 256 + k++;
      std::string s;
      if (cp < 0x80) s += static_cast<char>(cp);
      else s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
      byte_char[static_cast<size_t>(b)] = s;
    }
    const auto json = nlohmann::json::parse(slurp(asset("gpt2-encoder.json")));
    for (const auto& [key, value] : json.items()) encoder[key] = value.get<int64_t>();
    std::istringstream merges(slurp(asset("gpt2-vocab.bpe")));
    std::string line;
    std::getline(merges, line);  // "#version: 0.2"
    int rank = 0;
    while (std::getline(merges, line)) {
      const auto space = line.find(' ');
      if (space == std::string::npos) continue;
      ranks.emplace(std::make_pair(line.substr(0, space), line.substr(space + 1)), rank++);
    }
  }

  Ids encode_piece(const std::string& piece) const {
    std::vector<std::string> word;
    for (unsigned char c : piece) word.push_back(byte_char[c]);
    while (word.size() > 1) {
      int best = INT32_MAX;
      std::pair<std::string, std::string> bigram;
      for (size_t i = 0; i + 1 < word.size(); ++i) {
        const auto it = ranks.find({word[i], word[i + 1]});
        if (it != ranks.end() && it->second < best) best = it->second, bigram = it->first;
      }
      if (best == INT32_MAX) break;
      std::vector<std::string> merged;
      for (size_t i = 0; i < word.size();) {
        if (i + 1 < word.size() && word[i] == bigram.first && word[i + 1] == bigram.second) {
          merged.push_back(word[i] + word[i + 1]);
          i += 2;
        } else {
          merged.push_back(word[i++]);
        }
      }
      word = std::move(merged);
    }
    Ids ids;
    for (const auto& w : word) ids.push_back(encoder.at(w));
    return ids;
  }
};

// Only the letters of Moby Dick, from `from`: one piece of `n` bytes, as English without spaces.
std::string letters_only(size_t from, size_t n) {
  const std::string text = slurp(asset("moby-dick.txt"));
  std::string out;
  for (size_t i = from; i < text.size() && out.size() < n; ++i)
    if ((text[i] >= 'a' && text[i] <= 'z') || (text[i] >= 'A' && text[i] <= 'Z')) out += text[i];
  return out;
}

}  // namespace

TEST_CASE("gpt2 tokenizer: long pieces merge as encoder.py's bpe() does", "[gpt2]") {
  static const ReferenceBpe reference;
  std::vector<std::string> pieces = {letters_only(0, 2000), letters_only(500000, 2000), std::string(999, 'a'),
                                     std::string(1000, 'a') + "b" + std::string(77, 'a'), std::string(700, '7')};
  std::string ab;
  for (int i = 0; i < 300; ++i) ab += i % 3 ? "ab" : "abc";
  pieces.push_back(ab);
  for (int len : {65, 66, 100, 257}) pieces.push_back(letters_only(static_cast<size_t>(len) * 1000, len));
  for (const auto& piece : pieces) {
    INFO("piece of " << piece.size() << " bytes: " << piece.substr(0, 40));
    CHECK(tokenizer().encode(piece) == reference.encode_piece(piece));
  }
}

TEST_CASE("gpt2 tokenizer: 1 MB without spaces in seconds, not minutes", "[gpt2]") {
  std::string text = letters_only(0, 1000000);
  while (text.size() < 1000000) text += text.substr(0, 1000000 - text.size());
  const auto t0 = std::chrono::steady_clock::now();
  const Ids ids = tokenizer().encode(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("1 MB of letters: " << ids.size() << " tokens in " << s << " s");
  CHECK(tokenizer().decode(ids) == text);
  CHECK(s < 10.0);  // O(n log n): about half a second; the old scan took close to a minute
}
