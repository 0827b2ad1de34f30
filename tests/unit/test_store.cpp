// The rendezvous store: its wire format, its key-value rules, and the server and client over
// loopback sockets, strangers (no token, a wrong token, garbage, silence) included.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "engine/launch/socket_util.h"
#include "engine/launch/store_client.h"
#include "engine/launch/store_protocol.h"
#include "engine/launch/store_server.h"

using namespace me::launch;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using store::Frame;
using store::Op;
using store::Parse;
using store::Reply;

namespace {

Parse parse(const std::string& bytes, Frame* f, std::size_t* used, std::string* why,
            std::size_t max_body = store::kMaxBody) {
  return store::parse_frame(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), max_body, f, used, why);
}

std::string encode(const Frame& f) {
  std::string out;
  store::append_frame(f, out);
  return out;
}

Frame req(Op op, std::vector<std::string> fields, int64_t number = 0) {
  return Frame{static_cast<uint8_t>(op), number, std::move(fields)};
}

// A server whose log lines the test can read.
struct LoggedServer {
  std::mutex mutex;
  std::vector<std::string> lines;
  std::unique_ptr<StoreServer> server;
  explicit LoggedServer(std::chrono::milliseconds hello_timeout = 10s) {
    StoreServerOptions o;
    o.token = "the-right-token-0123456789";
    o.hello_timeout = hello_timeout;
    o.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex);
      lines.push_back(line);
    };
    server = std::make_unique<StoreServer>(o);
  }
  std::string log() {
    std::lock_guard<std::mutex> lock(mutex);
    std::string all;
    for (const auto& l : lines) all += l + "\n";
    return all;
  }
  StoreAddress address(const std::string& token = "the-right-token-0123456789") {
    return StoreAddress{"127.0.0.1", server->port(), token, "test client"};
  }
};

// A plain socket to the server; sends `bytes`, returns what comes back until the server closes
// (or 5 s pass).
std::string raw_exchange(int port, const std::string& bytes) {
  std::string why;
  const int fd = net::connect_until(net::resolve("127.0.0.1", port), net::Clock::now() + 5s, &why);
  REQUIRE(fd >= 0);
  if (!bytes.empty()) REQUIRE(net::send_all(fd, bytes, net::Clock::now() + 5s));
  std::string got;
  const auto deadline = net::Clock::now() + 5s;
  while (net::recv_some(fd, got, deadline) > 0) {
  }
  ::close(fd);
  return got;
}

}  // namespace

TEST_CASE("frames round-trip and parse incrementally", "[store]") {
  const Frame f = req(Op::set, {"key", std::string("v\0al", 4), ""}, -7);
  const std::string bytes = encode(f);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    Frame out;
    std::size_t used = 0;
    std::string why;
    CHECK(parse(bytes.substr(0, n), &out, &used, &why) == Parse::need_more);
  }
  Frame out;
  std::size_t used = 0;
  std::string why;
  REQUIRE(parse(bytes + "next", &out, &used, &why) == Parse::ok);
  CHECK(used == bytes.size());
  CHECK(out.code == f.code);
  CHECK(out.number == -7);
  CHECK(out.fields == f.fields);
}

TEST_CASE("malformed frames are refused with a reason", "[store]") {
  Frame out;
  std::size_t used = 0;
  std::string why;
  // A length above the limit is bad as soon as the 4 length bytes are in.
  CHECK(parse(std::string("\xff\xff\xff\x7f", 4), &out, &used, &why, 4096) == Parse::bad);
  CHECK_THAT(why, Contains("more than the 4096 allowed"));
  CHECK(parse(std::string("\x02\0\0\0ab", 6), &out, &used, &why) == Parse::bad);
  CHECK_THAT(why, Contains("shorter than its own header"));
  // 1 field announced, none there; a field longer than the frame; bytes after the last field.
  std::string body = std::string("\x02", 1) + std::string(8, '\0') + std::string("\x01\0\0\0", 4);
  CHECK(parse(std::string("\x0d\0\0\0", 4) + body, &out, &used, &why) == Parse::bad);
  std::string frame = encode(req(Op::get, {"abc"}));
  frame[store::kLengthBytes + store::kBodyHeaderBytes] = 9;  // field length 9 > 3 bytes there
  CHECK(parse(frame, &out, &used, &why) == Parse::bad);
  CHECK_THAT(why, Contains("runs past the end"));
  frame = encode(req(Op::get, {"abc"}));
  frame[0] = static_cast<char>(frame[0] + 1);
  frame += "x";
  CHECK(parse(frame, &out, &used, &why) == Parse::bad);
  CHECK_THAT(why, Contains("left over"));
}

TEST_CASE("the store state follows c10d's rules", "[store]") {
  store::StoreState s;
  CHECK(s.apply(req(Op::get, {"a"}), 0).code == uint8_t(Reply::missing));
  CHECK(s.apply(req(Op::set, {"a", "1"}), 0).code == uint8_t(Reply::ok));
  CHECK(s.apply(req(Op::get, {"a"}), 0).fields == std::vector<std::string>{"1"});
  CHECK(s.apply(req(Op::add, {"n"}, 5), 0).number == 5);
  CHECK(s.apply(req(Op::add, {"n"}, -2), 0).number == 3);
  CHECK(s.apply(req(Op::get, {"n"}), 0).fields[0] == "3");  // counters are decimal text
  CHECK(s.apply(req(Op::add, {"n"}, INT64_MAX), 0).code == uint8_t(Reply::error));
  CHECK(s.apply(req(Op::set, {"t", "text"}), 0).code == uint8_t(Reply::ok));
  CHECK(s.apply(req(Op::add, {"t"}, 1), 0).code == uint8_t(Reply::error));
  // compareSet: created only from an empty expectation; replaced only on a match.
  CHECK(s.apply(req(Op::compare_set, {"c", "x", "y"}), 0).fields[0] == "x");
  CHECK(s.apply(req(Op::check, {"c"}), 0).number == 0);
  CHECK(s.apply(req(Op::compare_set, {"c", "", "y"}), 0).fields[0] == "y");
  CHECK(s.apply(req(Op::compare_set, {"c", "nope", "z"}), 0).fields[0] == "y");
  CHECK(s.apply(req(Op::compare_set, {"c", "y", "z"}), 0).fields[0] == "z");
  CHECK(s.apply(req(Op::append, {"c", "!"}), 0).code == uint8_t(Reply::ok));
  CHECK(s.apply(req(Op::multi_get, {"a", "c"}), 0).fields == std::vector<std::string>{"1", "z!"});
  CHECK(s.apply(req(Op::multi_get, {"a", "none"}), 0).code == uint8_t(Reply::missing));
  CHECK(s.apply(req(Op::erase, {"a"}), 0).number == 1);
  CHECK(s.apply(req(Op::erase, {"a"}), 0).number == 0);
  CHECK(s.apply(req(Op::num_keys, {}), 0).number == 3);
  CHECK(s.apply(req(Op::get, {}), 0).code == uint8_t(Reply::error));  // wrong field count
  CHECK(s.apply(Frame{77, 0, {}}, 0).code == uint8_t(Reply::error));   // unknown op
}

TEST_CASE("ages count by the server's clock, and restart after a stall", "[store]") {
  store::StoreState s;
  s.apply(req(Op::set, {"hb/0", "a"}), 1000);
  s.apply(req(Op::set, {"hb/1", "b"}), 5000);
  s.apply(req(Op::set, {"hc/9", "c"}), 0);
  auto r = s.apply(req(Op::ages, {"hb/"}, 3000), 6000);  // hb/0 is 5 s old, hb/1 1 s
  REQUIRE(r.fields.size() == 3);
  CHECK(r.fields[0] == "hb/0");
  CHECK(r.fields[1] == "a");
  CHECK(r.fields[2] == "5000");
  CHECK(s.apply(req(Op::ages, {"hb/"}, 0), 6000).fields.size() == 6);
  s.reset_ages(5900);
  CHECK(s.apply(req(Op::ages, {"hb/"}, 3000), 6000).fields.empty());
}

TEST_CASE("server and client: set, get, add, wait across clients", "[store]") {
  LoggedServer srv;
  CHECK(srv.server->address() == "127.0.0.1");
  StoreClient a(srv.address(), 5s), b(srv.address(), 5s);
  a.set("k", std::string("v\0w", 3), 5s);
  CHECK(b.get("k", 5s) == std::string("v\0w", 3));
  CHECK(!b.get("nothing", 5s));
  CHECK(a.add("n", 2, 5s) == 2);
  CHECK(b.add("n", 3, 5s) == 5);
  CHECK(!a.wait({"late"}, 200ms));  // times out
  std::thread setter([&] {
    std::this_thread::sleep_for(300ms);
    b.set("late", "here", 5s);
  });
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(a.wait({"k", "late"}, 10s));
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  setter.join();
  CHECK(a.erase("late", 5s));
  CHECK(!a.check({"late"}, 5s));
  CHECK(srv.server->refused() == 0);
}

TEST_CASE("connections without the right token are refused and logged; the store goes on", "[store]") {
  LoggedServer srv(500ms);
  StoreClient member(srv.address(), 5s);
  member.set("before", "1", 5s);

  SECTION("a wrong token") {
    CHECK_THROWS_WITH(StoreClient(srv.address("a-wrong-token-0123456789"), 5s),
                      Contains("refused test client: refused by the rendezvous store: wrong job token"));
    CHECK_THAT(srv.log(), Contains("store: refused a connection from 127.0.0.1:") && Contains(": wrong job token"));
  }
  SECTION("no token: a request before the hello") {
    const std::string reply = raw_exchange(srv.server->port(), encode(req(Op::get, {"before"})));
    Frame f;
    std::size_t used = 0;
    std::string why;
    REQUIRE(parse(reply, &f, &used, &why) == Parse::ok);
    CHECK(f.code == uint8_t(Reply::refused));  // and no value
    CHECK_THAT(srv.log(), Contains("no job token (its first request was 'get')"));
  }
  SECTION("an empty token") {
    CHECK_THROWS_WITH(StoreClient(srv.address(""), 5s), Contains("no job token"));
  }
  SECTION("garbage, as an HTTP client would send") {
    raw_exchange(srv.server->port(), "GET / HTTP/1.0\r\n\r\n");
    CHECK_THAT(srv.log(), Contains("no job token (it sent something that is not a store request"));
  }
  SECTION("silence past the hello timeout") {
    raw_exchange(srv.server->port(), "");
    CHECK_THAT(srv.log(), Contains("no job token within 0.5 s"));
  }
  CHECK(srv.server->refused() == 1);
  member.set("after", "2", 5s);
  CHECK(member.get("before", 5s) == std::string("1"));
}

TEST_CASE("a loopback store is not reachable on this machine's other addresses", "[store]") {
  LoggedServer srv;
  // This machine's non-loopback addresses, from its interfaces.
  std::vector<net::Address> others;
  ifaddrs* ifs = nullptr;
  REQUIRE(::getifaddrs(&ifs) == 0);
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    char host[NI_MAXHOST];
    const socklen_t len = i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (getnameinfo(i->ifa_addr, len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) continue;
    for (auto& a : net::resolve(host, srv.server->port()))
      if (!a.loopback && a.text.rfind("fe80", 0) != 0) others.push_back(a);  // link-local needs a scope
  }
  ::freeifaddrs(ifs);
  if (others.empty()) {
    WARN("this machine has no non-loopback address: nothing to try");
    return;
  }
  std::string why;
  CHECK(net::connect_until(others, net::Clock::now() + 500ms, &why) == -1);
  CHECK_THAT(why, Contains("Connection refused"));
}

TEST_CASE("a multi-node job refuses a MASTER_ADDR that is loopback only", "[store]") {
  StoreServerOptions o;
  o.token = "0123456789abcdef0123";
  o.exclude_loopback = true;
  CHECK_THROWS_WITH(StoreServer(o), Contains("resolves to loopback only on this node (127.0.0.1)"));
}

TEST_CASE("a silent or absent store makes the client give up in time", "[store]") {
  // A socket that accepts (the kernel does, from the backlog) but never answers: a stopped rank 0.
  std::vector<net::Address> lo = net::resolve("127.0.0.1", 0);
  net::Address bound;
  const int fd = net::listen_on(lo, "127.0.0.1", 0, &bound);
  const int port = net::local_port(fd);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(StoreClient(StoreAddress{"127.0.0.1", port, "0123456789abcdef0123", "t"}, 300ms), StoreUnavailable);
  CHECK(std::chrono::steady_clock::now() - t0 < 8s);  // the handshake's own 5 s at most
  ::close(fd);
  // Nothing listens there any more: refused until the deadline.
  CHECK_THROWS_WITH(StoreClient(StoreAddress{"127.0.0.1", port, "0123456789abcdef0123", "t"}, 300ms),
                    Contains("cannot reach the rendezvous store at 127.0.0.1:") && Contains("Connection refused"));
}
