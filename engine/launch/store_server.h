// The job's rendezvous store server: a key-value map that the ranks use to find each other
// (Gloo's and NCCL's bootstrap), to publish heartbeats and collective progress, and to gather
// small objects. Replaces c10d's TCPStore, which listens on every interface and serves anyone:
// this one listens only on the interface of MASTER_ADDR (loopback for `megaengine --nproc`),
// and serves only connections that first present the job token (job_token.h). Others are
// refused and logged, and the job goes on.
//
// Rank 0 hosts it, in a thread of its own (see Communicator): every launcher (srun, torchrun,
// --nproc) starts rank 0, not all of them start anything else. So a rank 0 that is stopped
// (SIGSTOP, a hard hang of the whole process) takes the store down with it; the other ranks'
// watchdogs treat a store that stays silent for comm.dead_after_s as rank 0 being dead.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace me::launch {

struct StoreServerOptions {
  std::string host = "127.0.0.1";  // MASTER_ADDR: listens on the first address it resolves to
  int port = 0;                    // 0: a free port the kernel picks (see port())
  std::string token;               // the job token; required
  // A job spanning several nodes: skip loopback addresses (a node name that resolves to
  // 127.0.1.1 in /etc/hosts is unreachable from the other nodes).
  bool exclude_loopback = false;
  std::chrono::milliseconds hello_timeout{10000};  // to present the token after connecting
  std::function<void(const std::string&)> log;     // refusals; default: stderr
};

class StoreServer {
 public:
  // Listening when it returns. Throws me::Error naming the address and port when it cannot.
  explicit StoreServer(StoreServerOptions options);
  ~StoreServer();  // stops serving and closes every connection
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  const std::string& address() const { return address_; }  // the numeric address it listens on
  int64_t refused() const { return refused_.load(); }      // connections refused so far

  struct Impl;  // the server thread's state (store_server.cpp)

 private:
  void run();

  StoreServerOptions options_;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::string address_;
  std::atomic<int64_t> refused_{0};
  std::atomic<bool> stop_{false};
  int wake_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace me::launch
