#include "engine/metrics/proto_encoder.h"

#include <cstring>

namespace me::metrics {

void ProtoEncoder::raw_varint(uint64_t v) {
  while (v >= 0x80) {
    out_.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out_.push_back(static_cast<char>(v));
}

void ProtoEncoder::key(int field, int wire_type) {
  raw_varint(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}

void ProtoEncoder::little_endian(uint64_t v, int width) {
  for (int i = 0; i < width; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

ProtoEncoder& ProtoEncoder::varint(int field, int64_t value) {
  key(field, 0);
  raw_varint(static_cast<uint64_t>(value));
  return *this;
}

ProtoEncoder& ProtoEncoder::fixed64_double(int field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  key(field, 1);
  little_endian(bits, 8);
  return *this;
}

ProtoEncoder& ProtoEncoder::fixed32_float(int field, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  key(field, 5);
  little_endian(bits, 4);
  return *this;
}

ProtoEncoder& ProtoEncoder::bytes(int field, const std::string& value) {
  key(field, 2);
  raw_varint(value.size());
  out_ += value;
  return *this;
}

}  // namespace me::metrics
