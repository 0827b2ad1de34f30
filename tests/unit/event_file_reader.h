// An independent reader of TensorBoard event files, for tests: it shares no code with
// engine/metrics (its own bit-at-a-time CRC-32C, its own protobuf wire-format parser), so a
// writer bug is not mirrored by the reader. Throws std::runtime_error naming the record and
// what is wrong (length CRC, data CRC, truncation, malformed protobuf).
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace evreader {

// Bit by bit, from the definition: reflected Castagnoli polynomial, init and xor-out all ones.
inline uint32_t crc32c_bitwise(const std::string& s) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : s) {
    crc ^= byte;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return crc ^ 0xFFFFFFFFu;
}
inline uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

inline uint64_t le(const std::string& s, size_t at, int width) {
  uint64_t v = 0;
  for (int i = width - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<size_t>(i)]);
  return v;
}

// The data of every record in the file, each checked against both of its CRCs.
inline std::vector<std::string> read_records(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t at = 0;
  while (at < all.size()) {
    const std::string where = "record " + std::to_string(out.size()) + " at byte " + std::to_string(at);
    if (all.size() - at < 12) throw std::runtime_error(where + ": truncated header");
    const std::string length_bytes = all.substr(at, 8);
    if (le(all, at + 8, 4) != masked(crc32c_bitwise(length_bytes)))
      throw std::runtime_error(where + ": length CRC mismatch");
    const uint64_t n = le(all, at, 8);
    if (all.size() - at - 12 < n + 4) throw std::runtime_error(where + ": truncated data");
    std::string data = all.substr(at + 12, n);
    if (le(all, at + 12 + n, 4) != masked(crc32c_bitwise(data))) throw std::runtime_error(where + ": data CRC mismatch");
    out.push_back(std::move(data));
    at += 12 + n + 4;
  }
  return out;
}

// One protobuf field: varint, fixed32/fixed64 (raw bits in `number`) or length-delimited (`bytes`).
struct Field {
  int wire = 0;
  uint64_t number = 0;
  std::string bytes;
};
using Message = std::multimap<int, Field>;  // field number -> occurrences, in order

inline uint64_t read_varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (at >= s.size()) throw std::runtime_error("protobuf: varint runs past the end");
    const auto b = static_cast<unsigned char>(s[at++]);
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
  throw std::runtime_error("protobuf: varint longer than 10 bytes");
}

inline Message parse(const std::string& s) {
  Message m;
  size_t at = 0;
  while (at < s.size()) {
    const uint64_t key = read_varint(s, at);
    Field f;
    f.wire = static_cast<int>(key & 7);
    const int number = static_cast<int>(key >> 3);
    if (number == 0) throw std::runtime_error("protobuf: field number 0");
    if (f.wire == 0) {
      f.number = read_varint(s, at);
    } else if (f.wire == 1 || f.wire == 5) {
      const int width = f.wire == 1 ? 8 : 4;
      if (s.size() - at < static_cast<size_t>(width)) throw std::runtime_error("protobuf: fixed field past the end");
      f.number = le(s, at, width);
      at += static_cast<size_t>(width);
    } else if (f.wire == 2) {
      const uint64_t n = read_varint(s, at);
      if (s.size() - at < n) throw std::runtime_error("protobuf: length-delimited field past the end");
      f.bytes = s.substr(at, n);
      at += n;
    } else {
      throw std::runtime_error("protobuf: unexpected wire type " + std::to_string(f.wire));
    }
    m.emplace(number, std::move(f));
  }
  return m;
}

inline const Field* one(const Message& m, int number, int wire) {
  auto it = m.find(number);
  if (it == m.end()) return nullptr;
  if (it->second.wire != wire)
    throw std::runtime_error("protobuf: field " + std::to_string(number) + " has wire type " +
                             std::to_string(it->second.wire) + ", expected " + std::to_string(wire));
  return &it->second;
}

// The parts of tensorboard.Event this project writes (event.proto, summary.proto, tensor.proto).
struct Value {
  std::string tag;
  bool has_simple_value = false;
  float simple_value = 0;
  std::string plugin_name;        // metadata.plugin_data.plugin_name
  bool has_tensor = false;
  int dtype = 0;                  // tensor.dtype
  bool has_shape = false;         // tensor.tensor_shape present
  std::vector<int64_t> dims;      // tensor.tensor_shape.dim[].size
  std::vector<std::string> strings;  // tensor.string_val
};
struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<Value> values;
};

inline Value decode_value(const std::string& bytes) {
  const Message v = parse(bytes);
  Value out;
  if (auto* f = one(v, 1, 2)) out.tag = f->bytes;
  if (auto* f = one(v, 2, 5)) {
    out.has_simple_value = true;
    const auto bits = static_cast<uint32_t>(f->number);
    std::memcpy(&out.simple_value, &bits, 4);
  }
  if (auto* f = one(v, 9, 2)) {  // metadata.plugin_data.plugin_name; each Message named, as one()
    const Message metadata = parse(f->bytes);  // points into it (a temporary would be gone)
    if (auto* pd = one(metadata, 1, 2)) {
      const Message plugin_data = parse(pd->bytes);
      if (auto* name = one(plugin_data, 1, 2)) out.plugin_name = name->bytes;
    }
  }
  if (auto* f = one(v, 8, 2)) {
    out.has_tensor = true;
    const Message t = parse(f->bytes);
    if (auto* d = one(t, 1, 0)) out.dtype = static_cast<int>(d->number);
    if (auto* shape = one(t, 2, 2)) {
      out.has_shape = true;
      const Message sh = parse(shape->bytes);
      for (auto [it, end] = sh.equal_range(2); it != end; ++it) {
        const Message dim = parse(it->second.bytes);
        auto* size = one(dim, 1, 0);
        out.dims.push_back(size ? static_cast<int64_t>(size->number) : 0);
      }
    }
    for (auto [it, end] = t.equal_range(8); it != end; ++it) out.strings.push_back(it->second.bytes);
  }
  return out;
}

inline Event decode_event(const std::string& bytes) {
  const Message m = parse(bytes);
  Event e;
  if (auto* f = one(m, 1, 1)) std::memcpy(&e.wall_time, &f->number, 8);
  if (auto* f = one(m, 2, 0)) e.step = static_cast<int64_t>(f->number);
  if (auto* f = one(m, 3, 2)) e.file_version = f->bytes;
  if (auto* f = one(m, 5, 2)) {
    const Message summary = parse(f->bytes);
    for (auto [it, end] = summary.equal_range(1); it != end; ++it) e.values.push_back(decode_value(it->second.bytes));
  }
  return e;
}

}  // namespace evreader
