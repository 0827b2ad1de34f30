#include "engine/launch/free_port.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "engine/core/error.h"

namespace me::launch {

namespace {
// Binds a TCP socket on addr:port (0: the kernel's choice) and closes it. Returns the bound
// port, or -1 with the errno in *err.
int try_bind(const std::string& addr, int port, int* err) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) fail("cannot resolve master address '", addr, "': ", gai_strerror(rc));
  int bound_port = -1;
  for (addrinfo* ai = res; ai && bound_port < 0; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) {
      *err = errno;
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
      bound_port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                               : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    } else {
      *err = errno;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return bound_port;
}
}  // namespace

std::pair<int, int> ephemeral_port_range() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int first = 0, last = 0;
  if (f >> first >> last && first > 0 && last >= first && last < 65536) return {first, last};
  return {32768, 60999};
}

int pick_free_port(const std::string& addr) {
  int err = 0;
  const int below = ephemeral_port_range().first;
  constexpr int kLowest = 10000;  // clear of the well-known and commonly configured ports
  if (below > kLowest + 1000) {
    std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
    std::uniform_int_distribution<int> pick(kLowest, below - 1);
    for (int attempt = 0; attempt < 64; ++attempt)
      if (const int p = try_bind(addr, pick(rng), &err); p > 0) return p;
  }
  if (const int p = try_bind(addr, 0, &err); p > 0) return p;
  fail("cannot bind a TCP port on master address '", addr, "': ", std::strerror(err),
       " (is it an address of this machine?)");
}

}  // namespace me::launch
