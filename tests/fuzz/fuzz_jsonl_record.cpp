// The jsonl record parser of `megaengine preprocess`, on every line of the input as
// preprocess splits them: a record or a reason, never a crash or an escaping exception.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/data/jsonl_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  const char* end = p + size;
  // The key is the first line when the input has several (so keys get fuzzed too), else "text".
  std::string key = "text";
  if (const void* nl = std::memchr(p, '\n', size); nl && static_cast<const char*>(nl) - p < 64) {
    key.assign(p, static_cast<const char*>(nl));
    p = static_cast<const char*>(nl) + 1;
  }
  while (p < end) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<std::size_t>(end - p)));
    const char* e = nl ? nl : end;
    const auto record = me::data::parse_jsonl_record(p, e, key);
    if (record.ok == !record.why.empty()) std::abort();  // exactly one of: a text, a reason
    p = e + 1;
  }
  return 0;
}
