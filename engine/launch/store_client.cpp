#include "engine/launch/store_client.h"

#include <unistd.h>

#include <algorithm>

#include "engine/launch/socket_util.h"

namespace me::launch {
namespace {

using store::Frame;
using store::Op;
using store::Reply;
using Clock = std::chrono::steady_clock;

// A wait with no limit of its own still gives up on a server that stopped answering entirely.
constexpr auto kNoLimit = std::chrono::hours(24 * 365);
// Beyond a wait's own limit, how long its reply may take to arrive.
constexpr auto kReplySlack = std::chrono::seconds(10);

uint8_t code(Op op) { return static_cast<uint8_t>(op); }

std::string seconds_text(Clock::duration d) {
  return cat(std::chrono::duration_cast<std::chrono::milliseconds>(d).count() / 1000.0, " s");
}

}  // namespace

StoreClient::StoreClient(StoreAddress address, std::chrono::milliseconds connect_timeout)
    : address_(std::move(address)) {
  std::lock_guard<std::mutex> lock(mutex_);
  connect_locked(Clock::now() + connect_timeout);
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string StoreClient::local_host() {
  std::lock_guard<std::mutex> lock(mutex_);
  return fd_ >= 0 ? net::local_host(fd_) : "";
}

std::string StoreClient::where() const {
  return cat(address_.host, ":", address_.port, " (hosted by rank 0)");
}

void StoreClient::connect_locked(Clock::time_point deadline) {
  const auto started = Clock::now();
  const auto addresses = net::resolve(address_.host, address_.port);
  std::string why;
  const int fd = net::connect_until(addresses, deadline, &why);
  if (fd < 0)
    throw StoreUnavailable(cat("cannot reach the rendezvous store at ", where(), " within ",
                               seconds_text(Clock::now() - started), ": ", why));
  fd_ = fd;
  in_.clear();
  // A connection that just opened gets a moment for its handshake even at the deadline.
  const Frame reply =
      exchange_locked(Frame{code(Op::hello), 0, {address_.token, address_.who}}, std::max(deadline, Clock::now() + std::chrono::seconds(5)));
  if (reply.code == static_cast<uint8_t>(Reply::ok)) return;
  ::close(fd_);
  fd_ = -1;
  const std::string said = reply.fields.empty() ? "" : reply.fields[0];
  if (reply.code == static_cast<uint8_t>(Reply::refused))
    fail("the rendezvous store at ", where(), " refused ", address_.who, ": ", said);
  fail("the rendezvous store at ", where(), " answered the handshake with code ", int(reply.code), " ", said);
}

Frame StoreClient::exchange_locked(const Frame& request, Clock::time_point deadline) {
  const auto started = Clock::now();
  auto broken = [&](const std::string& what) {
    ::close(fd_);
    fd_ = -1;
    in_.clear();
    return StoreUnavailable(cat("the rendezvous store at ", where(), " ", what, " (request '",
                                store::op_name(request.code), "')"));
  };
  std::string bytes;
  store::append_frame(request, bytes);
  if (!net::send_all(fd_, bytes, deadline)) throw broken("did not take a request: the connection broke or stalled");
  while (true) {
    Frame reply;
    std::size_t used = 0;
    std::string why;
    const auto r = store::parse_frame(reinterpret_cast<const uint8_t*>(in_.data()), in_.size(), store::kMaxBody,
                                      &reply, &used, &why);
    if (r == store::Parse::ok) {
      in_.erase(0, used);
      return reply;
    }
    if (r == store::Parse::bad) throw broken("sent a malformed reply: " + why);
    const long n = net::recv_some(fd_, in_, deadline);
    if (n == -2) throw broken(cat("did not answer within ", seconds_text(Clock::now() - started)));
    if (n <= 0) throw broken("closed the connection (rank 0 has exited, or its node is gone)");
  }
}

Frame StoreClient::call(const Frame& request, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto deadline = Clock::now() + timeout;
  if (fd_ < 0) connect_locked(deadline);
  Frame reply = exchange_locked(request, deadline);
  if (reply.code == static_cast<uint8_t>(Reply::error))
    fail("store request '", store::op_name(request.code), "' failed: ", reply.fields.empty() ? "" : reply.fields[0]);
  return reply;
}

void StoreClient::set(const std::string& key, const std::string& value, std::chrono::milliseconds timeout) {
  call(Frame{code(Op::set), 0, {key, value}}, timeout);
}

std::optional<std::string> StoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  Frame r = call(Frame{code(Op::get), 0, {key}}, timeout);
  if (r.code == static_cast<uint8_t>(Reply::missing)) return std::nullopt;
  ME_CHECK(r.fields.size() == 1, "store: a reply to get holds ", r.fields.size(), " values");
  return std::move(r.fields[0]);
}

int64_t StoreClient::add(const std::string& key, int64_t delta, std::chrono::milliseconds timeout) {
  return call(Frame{code(Op::add), delta, {key}}, timeout).number;
}

bool StoreClient::check(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  return call(Frame{code(Op::check), 0, keys}, timeout).number != 0;
}

bool StoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds wait_for) {
  const auto limit = wait_for.count() > 0 ? std::chrono::duration_cast<std::chrono::milliseconds>(wait_for + kReplySlack)
                                          : std::chrono::duration_cast<std::chrono::milliseconds>(kNoLimit);
  return call(Frame{code(Op::wait), wait_for.count(), keys}, limit).code == static_cast<uint8_t>(Reply::ok);
}

bool StoreClient::erase(const std::string& key, std::chrono::milliseconds timeout) {
  return call(Frame{code(Op::erase), 0, {key}}, timeout).number != 0;
}

std::vector<StoreClient::Aged> StoreClient::ages(const std::string& prefix, std::chrono::milliseconds min_age,
                                                 std::chrono::milliseconds timeout) {
  const Frame r = call(Frame{code(Op::ages), min_age.count(), {prefix}}, timeout);
  ME_CHECK(r.fields.size() % 3 == 0, "store: a reply to ages holds ", r.fields.size(), " fields, not triples");
  std::vector<Aged> out;
  for (std::size_t i = 0; i < r.fields.size(); i += 3) {
    char* end = nullptr;
    const long long age = std::strtoll(r.fields[i + 2].c_str(), &end, 10);
    out.push_back({r.fields[i], r.fields[i + 1], age});
  }
  return out;
}

}  // namespace me::launch
