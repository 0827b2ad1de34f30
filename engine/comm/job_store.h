// The job's rendezvous store as the c10d::Store that Gloo's and NCCL's process groups take
// (through c10d::PrefixStore): a StoreClient underneath, so every connection presents the job
// token (store_client.h, store_server.h). Compiles against LibTorch 1.13 and 2.x; the
// differences of c10d::Store between them are named in engine/core/torch_compat.h.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "engine/launch/store_client.h"
#include "engine/core/torch_compat.h"

namespace me::comm {

// A store value as text and back (c10d stores bytes).
inline std::vector<uint8_t> store_bytes(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string store_text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

class JobStore : public c10d::Store {
 public:
  // Connects within connect_timeout (0: `timeout`); `timeout` is how long get() and wait() wait
  // for a key (c10d's store timeout). Throws StoreUnavailable / me::Error as StoreClient does.
  JobStore(const launch::StoreAddress& address, std::chrono::milliseconds timeout,
           std::chrono::milliseconds connect_timeout = std::chrono::milliseconds(0));

  launch::StoreClient& client() { return client_; }

#if ME_C10D_STORE_HAS_CLONE
  // A second connection to the same store, for a thread that must not queue behind this one.
  c10::intrusive_ptr<c10d::Store> clone() override;
#endif

  using c10d::Store::set;  // 2.x adds a std::string overload beside the virtual one
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  using c10d::Store::compareSet;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  // Waits (up to the store timeout) for the key, as c10d's TCPStore does.
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

#if ME_C10D_STORE_HAS_EXTENDED_API
  // Served by the server in one request each (atomic append), not get/set loops.
  void append(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override;
  bool hasExtendedApi() const override { return true; }
#endif

 private:
  launch::store::Frame request(launch::store::Op op, std::vector<std::string> fields, int64_t number = 0);
  [[noreturn]] void missing(const std::vector<std::string>& keys, std::chrono::milliseconds waited) const;

  launch::StoreClient client_;
};

}  // namespace me::comm
