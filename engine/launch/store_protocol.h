// The wire format of the job's rendezvous store (store_server.h, store_client.h), and the
// key-value state the server keeps. Socket-free, so the parser and the state can be fuzzed
// and tested on byte strings alone.
//
// Every message, request or reply, is one frame, little-endian:
//   u32 body length | body = u8 code | i64 number | u32 field count | (u32 length | bytes)*
// A request's code is an Op, a reply's a Reply. Fields are keys and values (any bytes); the
// number is a timeout, a delta or a result, depending on the op.
//
// A connection starts with `hello(token)`; the server answers ok, or refused and closes it.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace me::launch::store {

enum class Op : uint8_t {
  hello = 1,        // fields: token, who (for logs)
  set = 2,          // key, value
  get = 3,          // key -> ok [value] | missing
  add = 4,          // key; number: delta -> ok, number: the new value (stored as decimal text)
  check = 5,        // keys... -> ok, number: 1 if all exist
  wait = 6,         // keys...; number: timeout ms -> ok once all exist | timeout
  erase = 7,        // key -> ok, number: 1 if it existed
  num_keys = 8,     // -> ok, number
  compare_set = 9,  // key, expected, desired -> ok [value now] (c10d's compareSet rule)
  append = 10,      // key, bytes: appended (created when missing)
  multi_get = 11,   // keys... -> ok [values...] | missing
  multi_set = 12,   // key, value, key, value...
  ages = 13,        // prefix; number: min age ms -> ok [key, value, age ms]... for keys set that long ago
};

enum class Reply : uint8_t { ok = 100, missing = 101, timeout = 102, refused = 103, error = 104 };

struct Frame {
  uint8_t code = 0;
  int64_t number = 0;
  std::vector<std::string> fields;
};

// The size of the frame header and of a field's length prefix.
constexpr std::size_t kLengthBytes = 4;
constexpr std::size_t kBodyHeaderBytes = 1 + 8 + 4;
// Frames a connection may send before it has shown the job token, and after.
constexpr std::size_t kMaxHelloBody = 4096;
constexpr std::size_t kMaxBody = 256u << 20;

enum class Parse { ok, need_more, bad };

// Reads the frame at the start of data[0, size): ok (and *consumed bytes), need_more (a
// prefix of a valid frame so far), or bad (*error says why). A length above max_body is bad
// as soon as the 4 length bytes are in, so a peer cannot make us buffer more than that.
Parse parse_frame(const uint8_t* data, std::size_t size, std::size_t max_body, Frame* out, std::size_t* consumed,
                  std::string* error);

// Appends the frame's bytes (the one encoding parse_frame reads back).
void append_frame(const Frame& frame, std::string& out);

const char* op_name(uint8_t code);

// Why a request is malformed (an unknown op, a wrong number of fields), or "" when it is fine.
std::string check_request(const Frame& request);

// The server's key-value map. `now` is the server's clock (ms), so ages never mix two
// machines' clocks. apply() serves every op except hello and wait (the server's business).
class StoreState {
 public:
  Frame apply(const Frame& request, int64_t now_ms);
  bool has_all(const std::vector<std::string>& keys) const;
  // Ages are counted from no earlier than this: after the server itself was stalled (stopped,
  // swapped out), every key would otherwise look stale at once.
  void reset_ages(int64_t now_ms) { ages_from_ = now_ms; }
  std::size_t size() const { return values_.size(); }

 private:
  struct Entry {
    std::string value;
    int64_t set_ms = 0;
  };
  void put(const std::string& key, std::string value, int64_t now_ms);
  Frame add(const Frame& request, int64_t now_ms);
  Frame compare_set(const Frame& request, int64_t now_ms);
  Frame ages(const Frame& request, int64_t now_ms) const;

  std::map<std::string, Entry> values_;
  int64_t ages_from_ = 0;
};

}  // namespace me::launch::store
