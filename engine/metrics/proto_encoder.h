// The few protobuf encodings an event file needs, written by hand: libprotobuf clashes with
// LibTorch's copy (as SentencePiece showed), and an Event is a handful of fields.
// Wire format: each field is a key varint (field_number << 3 | wire_type) then its value;
// wire types used here: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 (little-endian).
#pragma once
#include <cstdint>
#include <string>

namespace me::metrics {

class ProtoEncoder {
 public:
  // int64/int32/enum/bool: a varint (negative int64 as its two's complement, 10 bytes).
  ProtoEncoder& varint(int field, int64_t value);
  ProtoEncoder& fixed64_double(int field, double value);
  ProtoEncoder& fixed32_float(int field, float value);
  // string, bytes, or an embedded message already encoded (ProtoEncoder::bytes()).
  ProtoEncoder& bytes(int field, const std::string& value);

  const std::string& bytes() const { return out_; }

 private:
  void raw_varint(uint64_t v);
  void key(int field, int wire_type);
  void little_endian(uint64_t v, int width);

  std::string out_;
};

}  // namespace me::metrics
