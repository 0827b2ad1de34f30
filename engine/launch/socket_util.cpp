#include "engine/launch/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "engine/core/error.h"

namespace me::launch::net {
namespace {

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

std::string numeric_host(const sockaddr* sa, socklen_t len) {
  char host[NI_MAXHOST];
  if (getnameinfo(sa, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) return "?";
  return host;
}

bool is_loopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->sa_family == AF_INET6) {
    const auto* a = &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return false;
}

std::string with_port(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? cat("[", host, "]:", port) : cat(host, ":", port);
}

}  // namespace

std::vector<Address> resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) fail("cannot resolve the rendezvous host '", host, "': ", gai_strerror(rc));
  std::vector<Address> out;
  for (const addrinfo* ai = found; ai; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
    Address a;
    std::memcpy(&a.addr, ai->ai_addr, ai->ai_addrlen);
    a.len = static_cast<socklen_t>(ai->ai_addrlen);
    a.text = numeric_host(ai->ai_addr, a.len);
    a.loopback = is_loopback(ai->ai_addr);
    const bool seen = std::any_of(out.begin(), out.end(), [&](const Address& b) { return b.text == a.text; });
    if (!seen) out.push_back(a);
  }
  freeaddrinfo(found);
  ME_CHECK(!out.empty(), "the rendezvous host '", host, "' resolves to no TCP address");
  return out;
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  int port = 0;
  if (ss.ss_family == AF_INET) port = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) port = ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return with_port(numeric_host(reinterpret_cast<sockaddr*>(&ss), len), port);
}

std::string local_host(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  return numeric_host(reinterpret_cast<sockaddr*>(&ss), len);
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int listen_on(const std::vector<Address>& addresses, const std::string& host, int port, Address* bound) {
  std::string tried;
  for (const auto& a : addresses) {
    const int fd = ::socket(a.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      tried += cat("; ", a.text, ": ", std::strerror(errno));
      continue;
    }
    int one = 1;
    // Lets a new job take the port while an old job's connections linger in TIME_WAIT; two
    // listeners on one port are still impossible.
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a.addr.ss_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&a.addr), a.len) == 0 && ::listen(fd, 1024) == 0) {
      *bound = a;
      return fd;
    }
    tried += cat("; ", with_port(a.text, port), ": ", std::strerror(errno));
    ::close(fd);
  }
  fail("the rendezvous store cannot listen on ", host, " port ", port, tried,
       " (is the port in use? is MASTER_ADDR an address of this node?)");
}

int local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -1;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return -1;
}

namespace {
// One non-blocking connect to `a`, finished or failed before `deadline`. 0 or an errno.
int connect_one(const Address& a, Clock::time_point deadline, int* out_fd) {
  const int fd = ::socket(a.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno;
  int err = 0;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a.addr), a.len) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int n;
      while ((n = ::poll(&p, 1, ms_until(deadline))) < 0 && errno == EINTR) {
      }
      socklen_t len = sizeof err;
      err = n == 0 ? ETIMEDOUT : 0;
      if (n > 0) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
  }
  if (err != 0) {
    ::close(fd);
    return err;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  set_nodelay(fd);
  *out_fd = fd;
  return 0;
}
}  // namespace

int connect_until(const std::vector<Address>& addresses, Clock::time_point deadline, std::string* why) {
  auto pause = std::chrono::milliseconds(20);
  while (true) {
    for (const auto& a : addresses) {
      int fd = -1;
      const int err = connect_one(a, deadline, &fd);
      if (err == 0) return fd;
      *why = cat(a.text, ": ", std::strerror(err));
    }
    if (Clock::now() + pause >= deadline) return -1;
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::milliseconds>(pause * 2, std::chrono::milliseconds(500));
  }
}

bool send_all(int fd, const std::string& data, Clock::time_point deadline) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, ms_until(deadline)) == 0) return false;
  }
  return true;
}

long recv_some(int fd, std::string& out, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, ms_until(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return -1;
    if (ready == 0) return -2;
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return n;
    out.append(buf, static_cast<std::size_t>(n));
    return n;
  }
}

}  // namespace me::launch::net
