// store_probe HOST PORT [TOKEN]: connects to a job's rendezvous store the way a stranger
// would and says what happened: "connected" (exit 0), "refused: <why>" (exit 2),
// "unreachable: <why>" (exit 3). With TOKEN it presents that token, as our client does;
// without, it asks for a key straight away, as a client of another store (c10d's TCPStore)
// or a curious user would. Used by tests/cli/store_token.sh; torch-free.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/launch/socket_util.h"
#include "engine/launch/store_client.h"
#include "engine/launch/store_protocol.h"

namespace {

using namespace me::launch;

int without_token(const std::string& host, int port) {
  const auto deadline = net::Clock::now() + std::chrono::seconds(5);
  std::string why;
  const int fd = net::connect_until(net::resolve(host, port), deadline, &why);
  if (fd < 0) {
    std::printf("unreachable: %s\n", why.c_str());
    return 3;
  }
  std::string request, in;
  store::append_frame(store::Frame{static_cast<uint8_t>(store::Op::get), 0, {"me/obj/1/0"}}, request);
  net::send_all(fd, request, deadline);
  store::Frame reply;
  std::size_t used = 0;
  while (store::parse_frame(reinterpret_cast<const uint8_t*>(in.data()), in.size(), store::kMaxBody, &reply, &used,
                            &why) == store::Parse::need_more) {
    if (net::recv_some(fd, in, deadline) <= 0) break;
  }
  ::close(fd);
  if (used == 0) {
    std::printf("unreachable: no reply\n");
    return 3;
  }
  const std::string said = reply.fields.empty() ? "" : reply.fields[0];
  if (reply.code == static_cast<uint8_t>(store::Reply::refused)) {
    std::printf("refused: %s\n", said.c_str());
    return 2;
  }
  std::printf("connected (the store answered a request without a token: %s)\n", said.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: store_probe HOST PORT [TOKEN]\n");
    return 64;
  }
  try {
    if (argc == 3) return without_token(argv[1], std::atoi(argv[2]));
    StoreClient client(StoreAddress{argv[1], std::atoi(argv[2]), argv[3], "store_probe"}, std::chrono::seconds(2));
    client.set("store_probe/was_here", "1", std::chrono::seconds(2));
    std::printf("connected\n");
    return 0;
  } catch (const StoreUnavailable& e) {
    std::printf("unreachable: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::printf("refused: %s\n", e.what());
    return 2;
  }
}
