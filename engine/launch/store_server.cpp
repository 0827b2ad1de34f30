#include "engine/launch/store_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "engine/launch/socket_util.h"
#include "engine/launch/store_protocol.h"
#include "engine/core/error.h"

namespace me::launch {
namespace {

using store::Frame;
using store::Op;
using store::Reply;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Compares in time independent of where the strings differ, so the token cannot be found
// byte by byte from response times.
bool same_token(const std::string& a, const std::string& b) {
  unsigned diff = static_cast<unsigned>(a.size() ^ b.size());
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

constexpr int kTickMs = 100;
constexpr std::size_t kMaxUnauthenticated = 256;      // connections still owing their token
constexpr std::size_t kReadPerTick = 4u << 20;         // per connection, for fairness
constexpr std::size_t kMaxPendingOutput = 512u << 20;  // a client that never reads its replies
constexpr int64_t kStallMs = 2000;                     // the loop itself did not run this long

struct Conn {
  int fd = -1;
  std::string peer, who;
  std::string in, out;
  bool authed = false, closing = false, dead = false;
  int64_t accepted_ms = 0;
  bool waiting = false;
  std::vector<std::string> wait_keys;
  int64_t wait_deadline = 0;  // 0: none
};

}  // namespace

struct StoreServer::Impl {
  int listen_fd = -1;
  std::vector<std::unique_ptr<Conn>> conns;
  store::StoreState state;
  int64_t last_loop_ms = 0;
  // Refusals are logged, but a port scan must not flood the log: 20 lines, then one a second.
  int64_t logged = 0, suppressed = 0, last_log_ms = 0;
};

StoreServer::StoreServer(StoreServerOptions options) : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  ME_CHECK(!options_.token.empty(), "the rendezvous store needs a job token");
  if (!options_.log) options_.log = [](const std::string& m) { std::fprintf(stderr, "megaengine: %s\n", m.c_str()); };
  auto addresses = net::resolve(options_.host, options_.port);
  if (options_.exclude_loopback) {
    std::vector<net::Address> reachable;
    std::string names;
    for (const auto& a : addresses) {
      names += (names.empty() ? "" : ", ") + a.text;
      if (!a.loopback) reachable.push_back(a);
    }
    ME_CHECK(!reachable.empty(), "MASTER_ADDR=", options_.host, " resolves to loopback only on this node (", names,
             "), which the other nodes of the job cannot reach: set MASTER_ADDR to this node's address on the "
             "cluster network (e.g. its IP)");
    addresses = reachable;
  }
  net::Address bound;
  impl_->listen_fd = net::listen_on(addresses, options_.host, options_.port, &bound);
  port_ = net::local_port(impl_->listen_fd);
  address_ = bound.text;
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(impl_->listen_fd);
    fail("the rendezvous store cannot create its wake-up pipe: ", std::strerror(errno));
  }
  thread_ = std::thread([this] { run(); });
}

StoreServer::~StoreServer() {
  stop_ = true;
  const char byte = 1;
  ssize_t ignored = ::write(wake_[1], &byte, 1);
  (void)ignored;
  if (thread_.joinable()) thread_.join();
  for (auto& c : impl_->conns) ::close(c->fd);
  ::close(impl_->listen_fd);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

namespace {

// The server's work on its connections; one object per run() call, touched by its thread only.
class Serving {
 public:
  Serving(StoreServer::Impl& s, const StoreServerOptions& o, std::atomic<int64_t>& refused)
      : s_(s), o_(o), refused_(refused) {}

  void accept_all(int64_t now) {
    while (true) {
      const int fd = ::accept4(s_.listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or a connection that went away before we took it
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->peer = net::peer_name(fd);
      c->accepted_ms = now;
      net::set_nodelay(fd);
      std::size_t pending = 0;
      for (const auto& other : s_.conns) pending += other->authed ? 0 : 1;
      s_.conns.push_back(std::move(c));
      if (pending >= kMaxUnauthenticated) refuse(*s_.conns.back(), "too many connections without a job token", now);
    }
  }

  void read(Conn& c, int64_t now) {
    std::size_t got = 0;
    while (got < kReadPerTick) {
      char buf[65536];
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        if (!c.closing) c.in.append(buf, static_cast<std::size_t>(n));  // a refused peer's bytes: dropped
        got += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      // Closed or broken. A connection that never showed a token was refused, in effect.
      if (!c.authed && !c.closing) refuse(c, "closed before presenting a job token", now);
      c.dead = true;
      return;
    }
    process(c, now);
  }

  // Serves the complete requests in c.in, in order; stops at a wait that cannot be answered yet.
  void process(Conn& c, int64_t now) {
    while (!c.waiting && !c.dead && !c.closing) {
      Frame f;
      std::size_t used = 0;
      std::string why;
      const auto limit = c.authed ? store::kMaxBody : store::kMaxHelloBody;
      const auto r = store::parse_frame(reinterpret_cast<const uint8_t*>(c.in.data()), c.in.size(), limit, &f, &used, &why);
      if (r == store::Parse::need_more) return;
      if (r == store::Parse::bad) {
        if (!c.authed) refuse(c, "no job token (it sent something that is not a store request: " + why + ")", now);
        else drop(c, "a malformed request: " + why);
        return;
      }
      c.in.erase(0, used);
      handle(c, f, now);
    }
  }

  void handle(Conn& c, const Frame& f, int64_t now) {
    if (!c.authed) return hello(c, f, now);
    if (f.code == static_cast<uint8_t>(Op::hello)) return drop(c, "a second hello");
    if (f.code == static_cast<uint8_t>(Op::wait)) {
      if (std::string why = store::check_request(f); !why.empty()) return send(c, {uint8_t(Reply::error), 0, {why}});
      if (s_.state.has_all(f.fields)) return send(c, {uint8_t(Reply::ok), 0, {}});
      c.waiting = true;
      c.wait_keys = f.fields;
      c.wait_deadline = f.number > 0 ? now + f.number : 0;
      return;
    }
    Frame reply;
    try {
      reply = s_.state.apply(f, now);
    } catch (const std::exception& e) {  // out of memory, say: this request fails, the store goes on
      reply = Frame{uint8_t(Reply::error), 0, {e.what()}};
    }
    send(c, reply);
  }

  void hello(Conn& c, const Frame& f, int64_t now) {
    if (f.code != static_cast<uint8_t>(Op::hello))
      return refuse(c, cat("no job token (its first request was '", store::op_name(f.code), "')"), now);
    if (!store::check_request(f).empty() || f.fields[0].empty()) return refuse(c, "no job token", now);
    if (!same_token(f.fields[0], o_.token)) return refuse(c, "wrong job token", now);
    c.authed = true;
    c.who = f.fields[1].substr(0, 200);
    send(c, {uint8_t(Reply::ok), 0, {}});
  }

  // Answers the waits whose keys all exist now, and those past their deadline.
  void serve_waits(int64_t now) {
    for (auto& c : s_.conns) {
      if (!c->waiting || c->dead) continue;
      const bool ready = s_.state.has_all(c->wait_keys);
      if (!ready && (c->wait_deadline == 0 || now < c->wait_deadline)) continue;
      c->waiting = false;
      c->wait_keys.clear();
      send(*c, {uint8_t(ready ? Reply::ok : Reply::timeout), 0, {}});
      process(*c, now);  // requests it sent behind the wait
    }
  }

  void expire_hellos(int64_t now) {
    for (auto& c : s_.conns)
      if (!c->authed && !c->closing && !c->dead && now - c->accepted_ms > o_.hello_timeout.count())
        refuse(*c, cat("no job token within ", o_.hello_timeout.count() / 1000.0, " s"), now);
  }

  void flush(Conn& c) {
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      c.dead = true;
      return;
    }
    if (c.out.empty() && c.closing) c.dead = true;
    if (c.out.size() > kMaxPendingOutput) drop(c, "more unread replies than the store keeps");
  }

 private:
  void send(Conn& c, const Frame& f) {
    try {
      store::append_frame(f, c.out);
    } catch (const std::exception& e) {  // a reply too large to send (ages of a huge prefix)
      c.out.clear();
      store::append_frame(Frame{uint8_t(Reply::error), 0, {e.what()}}, c.out);
    }
    flush(c);
  }

  void refuse(Conn& c, const std::string& why, int64_t now) {
    ++refused_;
    log(cat("store: refused a connection from ", c.peer, ": ", why), now);
    std::string message = cat("refused by the rendezvous store: ", why,
                              " (the store belongs to another job, or ME_JOB_TOKEN differs between the ranks)");
    c.closing = true;
    c.in.clear();
    store::append_frame(Frame{uint8_t(Reply::refused), 0, {message}}, c.out);
    flush(c);
  }

  void drop(Conn& c, const std::string& why) {
    log(cat("store: closing the connection of ", c.who, " (", c.peer, "): ", why), now_ms());
    c.dead = true;
  }

  void log(const std::string& line, int64_t now) {
    if (s_.logged >= 20 && now - s_.last_log_ms < 1000) {
      ++s_.suppressed;
      return;
    }
    std::string text = line;
    if (s_.suppressed > 0) text += cat(" (", s_.suppressed, " similar lines suppressed)");
    s_.suppressed = 0;
    ++s_.logged;
    s_.last_log_ms = now;
    o_.log(text);
  }

  StoreServer::Impl& s_;
  const StoreServerOptions& o_;
  std::atomic<int64_t>& refused_;
};

}  // namespace

void StoreServer::run() {
  Serving serving(*impl_, options_, refused_);
  auto& s = *impl_;
  s.last_loop_ms = now_ms();
  std::vector<pollfd> fds;
  while (!stop_) {
    fds.assign({{wake_[0], POLLIN, 0}, {s.listen_fd, POLLIN, 0}});
    for (const auto& c : s.conns)
      fds.push_back({c->fd, static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
    const int n = ::poll(fds.data(), fds.size(), kTickMs);
    const int64_t now = now_ms();
    // The loop did not run for a while (this process was stopped, or starved): heartbeats
    // that queued up meanwhile are not stale, so ages count from now.
    if (now - s.last_loop_ms > kStallMs) s.state.reset_ages(now);
    s.last_loop_ms = now;
    if (n > 0) {
      if (fds[0].revents) {
        char buf[64];
        while (::read(wake_[0], buf, sizeof buf) > 0) {
        }
      }
      // Connections accepted now are polled from the next round on; fds[i + 2] is conns[i].
      const std::size_t polled = s.conns.size();
      if (fds[1].revents) serving.accept_all(now);
      for (std::size_t i = 0; i < polled; ++i) {
        Conn& c = *s.conns[i];
        const short ev = fds[i + 2].revents;
        if (ev & POLLOUT) serving.flush(c);
        if (!c.dead && (ev & (POLLIN | POLLHUP | POLLERR))) serving.read(c, now);
      }
    }
    serving.serve_waits(now);
    serving.expire_hellos(now);
    for (std::size_t i = 0; i < s.conns.size();) {
      if (s.conns[i]->dead) {
        ::close(s.conns[i]->fd);
        s.conns.erase(s.conns.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
}

}  // namespace me::launch
