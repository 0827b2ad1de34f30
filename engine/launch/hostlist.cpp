#include "engine/launch/hostlist.h"

#include <cctype>
#include <cstddef>
#include <utility>

#include "engine/core/error.h"

namespace me::launch {
namespace {

// A typo such as "n[0-99999999]" must fail fast instead of allocating gigabytes of names; so
// must a long name with a large range (fuzzing found 95 bytes that asked for ~100 MB): the
// names' total length is bounded too, far above any real cluster (100k nodes x 40 characters).
constexpr std::size_t kMaxHosts = 1000000;
constexpr std::size_t kMaxNameBytes = 32u << 20;
// Keeps std::stoll far from overflow; no real node number has more digits than this.
constexpr std::size_t kMaxDigits = 9;

[[noreturn]] void bad_spec(const std::string& spec, const std::string& why) {
  fail("invalid host list '", spec, "': ", why);
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// Splits on commas that are not inside brackets, and checks bracket balance on the way, so
// the later stages can assume every '[' has its ']' and brackets do not nest.
std::vector<std::string> split_top_level(const std::string& spec) {
  std::vector<std::string> entries;
  std::string current;
  bool in_brackets = false;
  for (char c : spec) {
    if (c == '[') {
      if (in_brackets) bad_spec(spec, "nested '[' (brackets do not nest in a host list)");
      in_brackets = true;
    } else if (c == ']') {
      if (!in_brackets) bad_spec(spec, "unbalanced brackets: ']' without a matching '['");
      in_brackets = false;
    } else if (c == ',' && !in_brackets) {
      entries.push_back(current);
      current.clear();
      continue;
    }
    current += c;
  }
  if (in_brackets) bad_spec(spec, "unbalanced brackets: '[' is never closed");
  entries.push_back(current);
  for (const auto& entry : entries)
    if (entry.empty()) bad_spec(spec, "empty entry (stray or doubled comma)");
  return entries;
}

std::string pad_number(long long value, std::size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// Appends the numbers of one bracket item ("7" or "001-004") to `out`, zero padded to the
// width of the lower bound, which is how Slurm writes padded node numbers.
void expand_range_item(const std::string& spec, const std::string& item,
                       std::vector<std::string>& out) {
  if (item.empty()) bad_spec(spec, "empty range part inside brackets");
  const std::size_t dash = item.find('-');
  const std::string lo_text = item.substr(0, dash);
  const std::string hi_text = dash == std::string::npos ? lo_text : item.substr(dash + 1);
  if (lo_text.empty() || hi_text.empty())
    bad_spec(spec, cat("empty range part in '", item, "'"));
  if (!all_digits(lo_text) || !all_digits(hi_text))
    bad_spec(spec, cat("range '", item, "' is not numeric"));
  if (lo_text.size() > kMaxDigits || hi_text.size() > kMaxDigits)
    bad_spec(spec, cat("range '", item, "' has numbers longer than ", kMaxDigits, " digits"));
  const long long lo = std::stoll(lo_text);
  const long long hi = std::stoll(hi_text);
  if (hi < lo) bad_spec(spec, cat("range '", item, "' has its upper bound below the lower bound"));
  if (static_cast<std::size_t>(hi - lo) + out.size() >= kMaxHosts)
    bad_spec(spec, cat("expands to more than ", kMaxHosts, " hosts"));
  for (long long n = lo; n <= hi; ++n) out.push_back(pad_number(n, lo_text.size()));
}

// The values one bracket group stands for: "001-004,007" -> 001 002 003 004 007.
std::vector<std::string> expand_bracket(const std::string& spec, const std::string& body) {
  std::vector<std::string> values;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = body.find(',', start);
    expand_range_item(spec, body.substr(start, comma - start), values);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return values;
}

std::size_t total_size(const std::vector<std::string>& strings) {
  std::size_t n = 0;
  for (const auto& s : strings) n += s.size();
  return n;
}

// One top-level entry such as "rack[1-2]-node[01-03]". Walking left to right and extending
// every partial name by every value of the next group gives the leftmost group outermost.
// `bytes_so_far`: the length of the names the earlier entries gave; the bounds count both.
std::vector<std::string> expand_entry(const std::string& spec, const std::string& entry,
                                      std::size_t hosts_so_far, std::size_t bytes_so_far) {
  std::vector<std::string> names{""};
  std::size_t pos = 0, bytes = 0;  // bytes: total length of `names`
  auto check_bytes = [&](std::size_t more) {
    if (more > kMaxNameBytes || bytes_so_far + bytes + more > kMaxNameBytes)
      bad_spec(spec, cat("expands to more than ", kMaxNameBytes >> 20, " MiB of host names"));
    bytes += more;
  };
  while (pos < entry.size()) {
    const std::size_t open = entry.find('[', pos);
    const std::string literal = entry.substr(pos, open - pos);
    check_bytes(names.size() * literal.size());
    for (auto& name : names) name += literal;
    if (open == std::string::npos) break;
    const std::size_t close = entry.find(']', open);  // exists: split_top_level checked
    const auto values = expand_bracket(spec, entry.substr(open + 1, close - open - 1));
    if ((names.size() * values.size()) + hosts_so_far > kMaxHosts)
      bad_spec(spec, cat("expands to more than ", kMaxHosts, " hosts"));
    // Each name is repeated once per value, and each value appended once per name (both
    // counts are below kMaxHosts, the lengths below the spec's: no overflow).
    const std::size_t grown = bytes * values.size() + names.size() * total_size(values);
    bytes = 0;
    check_bytes(grown);
    std::vector<std::string> extended;
    extended.reserve(names.size() * values.size());
    for (const auto& name : names)
      for (const auto& value : values) extended.push_back(name + value);
    names = std::move(extended);
    pos = close + 1;
  }
  return names;
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& spec) {
  if (spec.empty()) fail("invalid host list '': the host list is empty");
  std::vector<std::string> hosts;
  std::size_t bytes = 0;
  for (const auto& entry : split_top_level(spec)) {
    for (auto& host : expand_entry(spec, entry, hosts.size(), bytes)) {
      bytes += host.size();
      hosts.push_back(std::move(host));
    }
  }
  return hosts;
}

std::string first_host(const std::string& spec) { return expand_hostlist(spec).front(); }

}  // namespace me::launch
