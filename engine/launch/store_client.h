// A connection to the job's rendezvous store (store_server.h): connects, presents the job
// token, then sends one request at a time. Thread-safe (one request at a time per client; a
// thread that must not wait behind another, such as the watchdog, uses a client of its own).
// Torch-free; the c10d::Store that Gloo and NCCL take wraps it (job_store.h).
#pragma once
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/launch/store_protocol.h"
#include "engine/core/error.h"

namespace me::launch {

// The store did not answer in time, or the connection broke: rank 0 (its host) may be dead,
// stopped or unreachable. A refusal or a bad request is a plain me::Error instead.
class StoreUnavailable : public Error {
 public:
  using Error::Error;
};

struct StoreAddress {
  std::string host;  // MASTER_ADDR
  int port = 0;
  std::string token;
  std::string who;  // how the server's log names this client, e.g. "rank 3 (node7)"
};

class StoreClient {
 public:
  // Connects, retrying while nothing listens yet (rank 0 may start later), and presents the
  // token. Throws StoreUnavailable at the deadline, me::Error when the token is refused.
  StoreClient(StoreAddress address, std::chrono::milliseconds connect_timeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  const StoreAddress& address() const { return address_; }
  // This end's address on the connection: the interface that reaches MASTER_ADDR ("" if not
  // connected now).
  std::string local_host();

  // One request and its reply within `timeout`. After a timeout or a broken connection the
  // next call connects again (within its own timeout).
  store::Frame call(const store::Frame& request, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::string& value, std::chrono::milliseconds timeout);
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout);
  int64_t add(const std::string& key, int64_t delta, std::chrono::milliseconds timeout);
  bool check(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // True once all keys exist; false when `wait_for` passed first (0: no limit).
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds wait_for);
  bool erase(const std::string& key, std::chrono::milliseconds timeout);

  // Keys under `prefix` that were last set at least `min_age` ago by the server's clock.
  struct Aged {
    std::string key, value;
    int64_t age_ms = 0;
  };
  std::vector<Aged> ages(const std::string& prefix, std::chrono::milliseconds min_age,
                         std::chrono::milliseconds timeout);

 private:
  void connect_locked(std::chrono::steady_clock::time_point deadline);
  store::Frame exchange_locked(const store::Frame& request, std::chrono::steady_clock::time_point deadline);
  std::string where() const;

  StoreAddress address_;
  std::mutex mutex_;
  int fd_ = -1;
  std::string in_;
};

}  // namespace me::launch
