#include "engine/launch/store_protocol.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "engine/core/error.h"

namespace me::launch::store {
namespace {

uint32_t read_u32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

int64_t read_i64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return static_cast<int64_t>(v);
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

void put_i64(std::string& out, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out += static_cast<char>((u >> (8 * i)) & 0xff);
}

Frame reply(Reply code, int64_t number = 0, std::vector<std::string> fields = {}) {
  return Frame{static_cast<uint8_t>(code), number, std::move(fields)};
}

// A counter's value as c10d stores it: decimal text. False for anything else.
bool parse_counter(const std::string& text, int64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  char buf[24];
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(buf, &end, 10);
  if (errno != 0 || end != buf + text.size()) return false;
  *out = v;
  return true;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

Parse parse_frame(const uint8_t* data, std::size_t size, std::size_t max_body, Frame* out, std::size_t* consumed,
                  std::string* error) {
  if (size < kLengthBytes) return Parse::need_more;
  const std::size_t body = read_u32(data);
  if (body > max_body) {
    *error = cat("a frame of ", body, " bytes, more than the ", max_body, " allowed here");
    return Parse::bad;
  }
  if (body < kBodyHeaderBytes) {
    *error = cat("a frame of ", body, " bytes, shorter than its own header");
    return Parse::bad;
  }
  if (size - kLengthBytes < body) return Parse::need_more;
  const uint8_t* p = data + kLengthBytes;
  const uint8_t* end = p + body;
  Frame f;
  f.code = p[0];
  f.number = read_i64(p + 1);
  const std::size_t count = read_u32(p + 9);
  p += kBodyHeaderBytes;
  // Each field takes at least its 4 length bytes: a count beyond that cannot be honest.
  if (count > static_cast<std::size_t>(end - p) / kLengthBytes) {
    *error = cat("a frame announcing ", count, " fields in ", body, " bytes");
    return Parse::bad;
  }
  f.fields.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (static_cast<std::size_t>(end - p) < kLengthBytes) {
      *error = cat("field ", i, " of ", count, " runs past the end of the frame");
      return Parse::bad;
    }
    const std::size_t n = read_u32(p);
    p += kLengthBytes;
    if (n > static_cast<std::size_t>(end - p)) {
      *error = cat("field ", i, " of ", count, " (", n, " bytes) runs past the end of the frame");
      return Parse::bad;
    }
    f.fields.emplace_back(reinterpret_cast<const char*>(p), n);
    p += n;
  }
  if (p != end) {
    *error = cat(end - p, " bytes left over after the last field of the frame");
    return Parse::bad;
  }
  *out = std::move(f);
  *consumed = kLengthBytes + body;
  return Parse::ok;
}

void append_frame(const Frame& frame, std::string& out) {
  std::size_t body = kBodyHeaderBytes;
  for (const auto& field : frame.fields) body += kLengthBytes + field.size();
  ME_CHECK(body <= kMaxBody, "store: a message of ", body, " bytes is larger than the ", kMaxBody, " allowed");
  out.reserve(out.size() + kLengthBytes + body);
  put_u32(out, static_cast<uint32_t>(body));
  out += static_cast<char>(frame.code);
  put_i64(out, frame.number);
  put_u32(out, static_cast<uint32_t>(frame.fields.size()));
  for (const auto& field : frame.fields) {
    put_u32(out, static_cast<uint32_t>(field.size()));
    out += field;
  }
}

const char* op_name(uint8_t code) {
  switch (static_cast<Op>(code)) {
    case Op::hello: return "hello";
    case Op::set: return "set";
    case Op::get: return "get";
    case Op::add: return "add";
    case Op::check: return "check";
    case Op::wait: return "wait";
    case Op::erase: return "delete";
    case Op::num_keys: return "num_keys";
    case Op::compare_set: return "compare_set";
    case Op::append: return "append";
    case Op::multi_get: return "multi_get";
    case Op::multi_set: return "multi_set";
    case Op::ages: return "ages";
  }
  return "unknown";
}

std::string check_request(const Frame& r) {
  const std::size_t n = r.fields.size();
  auto need = [&](bool ok, const char* what) {
    return ok ? std::string() : cat("store request ", op_name(r.code), " needs ", what, ", got ", n, " fields");
  };
  switch (static_cast<Op>(r.code)) {
    case Op::hello: return need(n == 2, "a token and a name");
    case Op::set: case Op::append: return need(n == 2, "a key and a value");
    case Op::get: case Op::add: case Op::erase: return need(n == 1, "one key");
    case Op::check: case Op::multi_get: return need(n >= 1, "at least one key");
    case Op::wait:
      if (r.number < 0) return cat("store request wait has a negative timeout (", r.number, " ms)");
      return need(n >= 1, "at least one key");
    case Op::num_keys: return need(n == 0, "no fields");
    case Op::compare_set: return need(n == 3, "a key, the expected and the desired value");
    case Op::multi_set: return need(n % 2 == 0, "keys and values in pairs");
    case Op::ages: return need(n == 1, "a key prefix");
  }
  return cat("unknown store request code ", static_cast<int>(r.code));
}

bool StoreState::has_all(const std::vector<std::string>& keys) const {
  for (const auto& k : keys)
    if (values_.find(k) == values_.end()) return false;
  return true;
}

void StoreState::put(const std::string& key, std::string value, int64_t now_ms) {
  auto& e = values_[key];
  e.value = std::move(value);
  e.set_ms = now_ms;
}

Frame StoreState::add(const Frame& r, int64_t now_ms) {
  int64_t value = 0;
  auto it = values_.find(r.fields[0]);
  if (it != values_.end() && !parse_counter(it->second.value, &value))
    return reply(Reply::error, 0, {cat("key '", r.fields[0], "' does not hold a counter")});
  if ((r.number > 0 && value > std::numeric_limits<int64_t>::max() - r.number) ||
      (r.number < 0 && value < std::numeric_limits<int64_t>::min() - r.number))
    return reply(Reply::error, 0, {cat("counter '", r.fields[0], "' would overflow")});
  value += r.number;
  put(r.fields[0], std::to_string(value), now_ms);
  return reply(Reply::ok, value);
}

// c10d's rule: a missing key is created when the expected value is empty; an existing one is
// replaced when it equals the expected value. The reply holds the value the key has after.
Frame StoreState::compare_set(const Frame& r, int64_t now_ms) {
  const std::string& key = r.fields[0];
  auto it = values_.find(key);
  if (it == values_.end()) {
    if (!r.fields[1].empty()) return reply(Reply::ok, 0, {r.fields[1]});
    put(key, r.fields[2], now_ms);
    return reply(Reply::ok, 0, {r.fields[2]});
  }
  if (it->second.value == r.fields[1]) put(key, r.fields[2], now_ms);
  return reply(Reply::ok, 0, {values_[key].value});
}

Frame StoreState::ages(const Frame& r, int64_t now_ms) const {
  Frame out = reply(Reply::ok);
  const std::string& prefix = r.fields[0];
  for (auto it = values_.lower_bound(prefix); it != values_.end() && starts_with(it->first, prefix); ++it) {
    const int64_t age = now_ms - std::max(it->second.set_ms, ages_from_);
    if (age < r.number) continue;
    out.fields.push_back(it->first);
    out.fields.push_back(it->second.value);
    out.fields.push_back(std::to_string(age));
  }
  return out;
}

Frame StoreState::apply(const Frame& r, int64_t now_ms) {
  if (std::string why = check_request(r); !why.empty()) return reply(Reply::error, 0, {why});
  const auto& f = r.fields;
  switch (static_cast<Op>(r.code)) {
    case Op::set: put(f[0], f[1], now_ms); return reply(Reply::ok);
    case Op::get: {
      auto it = values_.find(f[0]);
      return it == values_.end() ? reply(Reply::missing) : reply(Reply::ok, 0, {it->second.value});
    }
    case Op::add: return add(r, now_ms);
    case Op::check: return reply(Reply::ok, has_all(f) ? 1 : 0);
    case Op::erase: return reply(Reply::ok, values_.erase(f[0]) ? 1 : 0);
    case Op::num_keys: return reply(Reply::ok, static_cast<int64_t>(values_.size()));
    case Op::compare_set: return compare_set(r, now_ms);
    case Op::append: {
      auto it = values_.find(f[0]);
      const std::size_t had = it == values_.end() ? 0 : it->second.value.size();
      if (had + f[1].size() > kMaxBody - 1024)
        return reply(Reply::error, 0, {cat("key '", f[0], "' would grow past the largest value a reply can carry")});
      put(f[0], (it == values_.end() ? std::string() : it->second.value) + f[1], now_ms);
      return reply(Reply::ok);
    }
    case Op::multi_get: {
      if (!has_all(f)) return reply(Reply::missing);
      Frame out = reply(Reply::ok);
      for (const auto& k : f) out.fields.push_back(values_.at(k).value);
      return out;
    }
    case Op::multi_set:
      for (std::size_t i = 0; i < f.size(); i += 2) put(f[i], f[i + 1], now_ms);
      return reply(Reply::ok);
    case Op::ages: return ages(r, now_ms);
    case Op::hello: case Op::wait: break;
  }
  return reply(Reply::error, 0, {cat("store request ", op_name(r.code), " is not served here")});
}

}  // namespace me::launch::store
