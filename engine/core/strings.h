// Joining and splitting strings, for the few places that print or parse lists (doctor's checks,
// the environment probe). Header-only and torch-free.
#pragma once
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace me {

// "a, b, c" from {"a", "b", "c"} and ", ".
inline std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// The non-empty pieces of `s` between separators: "a::b:" -> {"a", "b"}.
inline std::vector<std::string> split_nonempty(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, sep))
    if (!part.empty()) out.push_back(part);
  return out;
}

// "4" -> 4: a count of GPUs, processes or layouts given on the command line; 0 when `text` is
// missing, not a whole number, below 1 or above 2^20.
inline long positive_count(const char* text) {
  char* end = nullptr;
  const long v = text ? std::strtol(text, &end, 10) : 0;
  return (!text || !end || *end || v < 1 || v > 1 << 20) ? 0 : v;
}

}  // namespace me
