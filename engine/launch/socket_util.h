// Small POSIX TCP helpers shared by the store's server and client: name resolution, listening
// on one interface, connecting and reading with deadlines. Torch-free.
#pragma once
#include <sys/socket.h>

#include <chrono>
#include <string>
#include <vector>

namespace me::launch::net {

using Clock = std::chrono::steady_clock;

struct Address {
  sockaddr_storage addr{};
  socklen_t len = 0;
  std::string text;  // numeric host, "127.0.0.1" or "::1"
  bool loopback = false;
};

// Every TCP address `host` resolves to (numeric or a name), in the resolver's order. Throws
// me::Error naming the host when it resolves to nothing.
std::vector<Address> resolve(const std::string& host, int port);

// "10.1.2.3:4567" / "[fd00::2]:4567" for a connected socket's peer, or "?".
std::string peer_name(int fd);
// The numeric local address of a connected socket ("10.1.2.3", "fd00::2"), or "" on error.
std::string local_host(int fd);

// A listening, non-blocking, close-on-exec socket on the first of `addresses` that binds (the
// interface of that address only). Throws me::Error listing what was tried and why it failed.
int listen_on(const std::vector<Address>& addresses, const std::string& host, int port, Address* bound);
int local_port(int fd);

void set_nonblocking(int fd);
void set_nodelay(int fd);

// A connected, blocking socket to one of `addresses`, retrying refused connections (nothing
// listens yet) until `deadline`. Returns -1 at the deadline; *why says the last failure.
int connect_until(const std::vector<Address>& addresses, Clock::time_point deadline, std::string* why);

// Writes all of `data` before `deadline`; false when the deadline passed or the peer is gone.
bool send_all(int fd, const std::string& data, Clock::time_point deadline);
// Reads what is available (at least one byte) into `out` before `deadline`: the byte count,
// 0 when the peer closed the connection, -1 on error, -2 at the deadline.
long recv_some(int fd, std::string& out, Clock::time_point deadline);

}  // namespace me::launch::net
