#include "engine/core/utf8.h"

#include <cstddef>
#include <cstdint>

namespace me::utf8 {
namespace {

// How many bytes the well-formed sequence at s[i] has, or 0 when it is ill-formed; then
// `subpart` is the length of its maximal subpart (at least 1: the bytes one U+FFFD stands for).
// The ranges are the Unicode Standard's table of well-formed byte sequences: the second byte's
// range depends on the first (which excludes overlong forms, surrogates and > U+10FFFF), the
// later ones are 80..BF.
size_t sequence_at(std::string_view s, size_t i, size_t& subpart) {
  const auto b = static_cast<uint8_t>(s[i]);
  subpart = 1;
  if (b < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) need = 1;
  else if (b == 0xE0) { need = 2; lo = 0xA0; }
  else if (b >= 0xE1 && b <= 0xEC) need = 2;
  else if (b == 0xED) { need = 2; hi = 0x9F; }
  else if (b >= 0xEE && b <= 0xEF) need = 2;
  else if (b == 0xF0) { need = 3; lo = 0x90; }
  else if (b >= 0xF1 && b <= 0xF3) need = 3;
  else if (b == 0xF4) { need = 3; hi = 0x8F; }
  else return 0;  // 80..C1 (continuation bytes, overlong leads) and F5..FF never start a character
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;  // truncated: the bytes so far are the subpart
    const auto c = static_cast<uint8_t>(s[i + k]);
    if (c < lo || c > hi) return 0;
    lo = 0x80;
    hi = 0xBF;
    subpart = k + 1;
  }
  return need + 1;
}

}  // namespace

bool is_valid(std::string_view bytes) {
  size_t subpart = 0;
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = sequence_at(bytes, i, subpart);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string repair(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t subpart = 0;
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = sequence_at(bytes, i, subpart);
    if (n > 0) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      out.append(kReplacement);
      i += subpart;
    }
  }
  return out;
}

}  // namespace me::utf8
