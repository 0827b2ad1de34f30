// The rendezvous store's message parser and state, fed a byte stream as a connection would be:
// the first frame under the hello limit, the rest under the full one, each applied to a store.
// Checks: parse_frame never reads outside the input, a parsed frame encodes back to exactly its
// bytes, and applying any request leaves the store able to encode its reply.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/launch/store_protocol.h"
#include "engine/core/error.h"

using namespace me::launch::store;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  StoreState state;
  std::size_t offset = 0;
  bool hello_seen = false;
  int64_t now = 0;
  while (offset < size) {
    Frame frame;
    std::size_t used = 0;
    std::string why;
    const auto r = parse_frame(data + offset, size - offset, hello_seen ? kMaxBody : kMaxHelloBody, &frame, &used, &why);
    if (r == Parse::need_more) break;
    if (r == Parse::bad) {
      if (why.empty()) std::abort();  // a refusal always says why
      break;
    }
    std::string again;
    append_frame(frame, again);
    if (used > size - offset || again.size() != used || std::memcmp(again.data(), data + offset, used) != 0) std::abort();
    offset += used;
    if (!hello_seen) {
      hello_seen = true;
      continue;
    }
    if (frame.code == static_cast<uint8_t>(Op::wait)) {
      if (check_request(frame).empty()) state.has_all(frame.fields);
      continue;
    }
    now += 250;
    if (frame.number % 7 == 0) state.reset_ages(now);
    std::string reply;
    append_frame(state.apply(frame, now), reply);
  }
  return 0;
}
