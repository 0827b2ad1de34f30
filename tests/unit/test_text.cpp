// Text for people: valid UTF-8 from any bytes (engine/core/utf8.h) and rounded numbers in log
// lines (engine/core/format.h). The expected U+FFFD counts are Python 3's:
// bytes.decode("utf-8", errors="replace"), which replaces each maximal ill-formed subpart.
#include <catch2/catch.hpp>

#include <string>

#include "engine/core/format.h"
#include "engine/core/utf8.h"

namespace utf8 = me::utf8;
namespace human = me::human;

namespace {
const std::string R = "\xEF\xBF\xBD";  // U+FFFD
std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}
}  // namespace

TEST_CASE("utf8: valid text is unchanged", "[utf8]") {
  for (const std::string s : {"", "plain ascii\n\t", "caf\xC3\xA9", "\xE4\xB8\xAD\xE6\x96\x87", "\xF0\x9F\x98\x80",
                              "\xEF\xBF\xBD", "\xF4\x8F\xBF\xBF" /* U+10FFFF */, "\xED\x9F\xBF" /* U+D7FF */,
                              "\xEE\x80\x80" /* U+E000 */, "\xC2\x80", "\xDF\xBF", "\xE0\xA0\x80"}) {
    CHECK(utf8::is_valid(s));
    CHECK(utf8::repair(s) == s);
  }
  CHECK(utf8::repair(std::string("a\0b", 3)) == std::string("a\0b", 3));  // NUL is a character
}

TEST_CASE("utf8: truncated multi-byte sequences become one U+FFFD each", "[utf8]") {
  CHECK(utf8::repair("\xC3") == R);
  CHECK(utf8::repair("\xE2\x82") == R);                 // two bytes of the euro sign
  CHECK(utf8::repair("a\xF0\x9F\x98") == "a" + R);      // three bytes of an emoji
  CHECK(utf8::repair("\xF0\x9F\x98 b") == R + " b");    // ... cut off by an ASCII byte
  CHECK(utf8::repair("\xE2\x82\xE2\x82\xAC") == R + "\xE2\x82\xAC");  // cut off by a whole character
  CHECK(utf8::repair("x\xF0") == "x" + R);
  CHECK_FALSE(utf8::is_valid("\xE2\x82"));
}

TEST_CASE("utf8: lone continuation bytes and bytes that never start a character", "[utf8]") {
  CHECK(utf8::repair("\x80") == R);
  CHECK(utf8::repair("a\x80\xBF" "b") == "a" + R + R + "b");   // one U+FFFD per stray byte
  CHECK(utf8::repair("\xF0\x9F\x98\x80\x80") == "\xF0\x9F\x98\x80" + R);  // one too many
  CHECK(utf8::repair("\xFE\xFF") == R + R);
  CHECK(utf8::repair("\xF5\x80\x80\x80") == repeat(R, 4));  // F5..FF: beyond U+10FFFF
  CHECK_FALSE(utf8::is_valid("\x80"));
}

TEST_CASE("utf8: overlong forms, surrogates and code points past U+10FFFF", "[utf8]") {
  CHECK(utf8::repair("\xC0\x80") == R + R);          // overlong NUL
  CHECK(utf8::repair("\xC1\xBF") == R + R);
  CHECK(utf8::repair("\xE0\x80\xAF") == repeat(R, 3));   // overlong '/'
  CHECK(utf8::repair("\xF0\x80\x80\xAF") == repeat(R, 4));
  CHECK(utf8::repair("\xF0\x80\x80") == repeat(R, 3));
  CHECK(utf8::repair("\xED\xA0\x80") == repeat(R, 3));   // U+D800, a surrogate
  CHECK(utf8::repair("\xF4\x90\x80\x80") == repeat(R, 4));  // U+110000
  for (const std::string s : {"\xC0\x80", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80"}) CHECK_FALSE(utf8::is_valid(s));
}

TEST_CASE("utf8: the Unicode Standard's example of maximal subparts", "[utf8]") {
  // Unicode 15, section 3.9, table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
  const std::string in = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  CHECK(utf8::repair(in) == "a" + R + R + R + "b" + R + "c" + R + R + "d");
  // Python: b'\xe1\x80\xe2\xf0\x91\x92\xf1\xbfA'.decode('utf-8', 'replace') == '\ufffd' * 4 + 'A'
  CHECK(utf8::repair("\xE1\x80\xE2\xF0\x91\x92\xF1\xBF" "A") == repeat(R, 4) + "A");
}

TEST_CASE("human: durations", "[format]") {
  CHECK(human::seconds(0.0995405) == "0.10 s");  // the preprocess line of issue 24
  CHECK(human::seconds(0) == "0 s");
  CHECK(human::seconds(0.5) == "0.50 s");
  CHECK(human::seconds(1.234) == "1.23 s");
  CHECK(human::seconds(9.999) == "10.0 s");
  CHECK(human::seconds(12.345) == "12.3 s");
  CHECK(human::seconds(152.4) == "152 s");
  CHECK(human::seconds(600) == "600 s");      // a 600 s timeout reads as the recipe wrote it
  CHECK(human::seconds(725) == "12 min 05 s");
  CHECK(human::seconds(3599.7) == "1 h 00 min");
  CHECK(human::seconds(11220) == "3 h 07 min");
  CHECK(human::seconds(0.0042) == "4.20 ms");
  CHECK(human::seconds(0.00004512) == "45.1 us");
}

TEST_CASE("human: numbers, rates and sizes", "[format]") {
  CHECK(human::rate(12.1056, "MB/s") == "12.1 MB/s");  // the preprocess line of issue 24
  CHECK(human::rate(48213.7, "tokens/s") == "48214 tokens/s");
  CHECK(human::number(0) == "0");
  CHECK(human::number(1.0) == "1.00");
  CHECK(human::number(0.0995) == "0.0995");
  CHECK(human::number(0.099951) == "0.100");  // rounds up to the next power: three figures
  CHECK(human::number(0.000123456) == "0.000123");
  CHECK(human::number(-3.14159) == "-3.14");
  CHECK(human::number(99.96) == "100");
  CHECK(human::bytes(512) == "512 B");
  CHECK(human::bytes(1536) == "1.50 KiB");
  CHECK(human::bytes(24.0 * 1048576) == "24.0 MiB");
  CHECK(human::bytes(3.21 * 1073741824.0) == "3.21 GiB");
  CHECK(human::bytes(700.0 * 1073741824.0) == "700 GiB");
}
