// The communicator's watchdog thread: publishes this rank's heartbeat and collective progress
// through the rendezvous store, ends the job when another rank's heartbeat stays silent for
// comm.dead_after_s, and explains failed collectives from what the others published.
//
// Store keys: me/hb/R (rank R's heartbeat; its value is R's last collective), me/progress/G/R
// (collectives R started on group G), me/failed/R (R saw a collective fail: a survivor, not a
// cause), me/left/R (R closed its communicator). Ages are the server's: no two clocks mixed.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "engine/comm/communicator.h"
#include "engine/core/error.h"
#include "engine/core/log.h"

namespace me::comm {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::string seconds(int64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(ms) / 1000.0);
  return buf;
}

std::chrono::milliseconds ms_of(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

// "me/hb/12" -> 12; -1 for anything else.
int rank_of(const std::string& key, const std::string& prefix) {
  if (key.compare(0, prefix.size(), prefix) != 0) return -1;
  const std::string digits = key.substr(prefix.size());
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoi(digits);
}

}  // namespace

std::chrono::milliseconds Communicator::heartbeat() const { return ms_of(options_.heartbeat_s); }
std::chrono::milliseconds Communicator::dead_after() const { return ms_of(options_.dead_after_s); }

// "all_reduce #12 on group 'dp-0', started 3.2 s before": the most recent start over all groups.
std::string Communicator::last_collective() {
  std::lock_guard<std::mutex> lock(groups_mutex_);
  std::shared_ptr<ProcessGroup> latest;
  for (auto& weak : groups_) {
    auto g = weak.lock();
    if (g && g->last_op() && (!latest || g->last_started() > latest->last_started())) latest = g;
  }
  if (!latest) return "none yet";
  const auto ago = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - latest->last_started());
  return cat(latest->last_op(), " #", latest->collectives_started(), " on group '", latest->name(), "', started ",
             seconds(ago.count()), " before");
}

void Communicator::publish_progress(launch::StoreClient& store, std::chrono::milliseconds timeout) {
  store.set(cat("me/hb/", env_.rank), last_collective(), timeout);
  std::vector<std::pair<std::string, int64_t>> changed;
  {
    std::lock_guard<std::mutex> lock(groups_mutex_);
    for (auto& weak : groups_) {
      auto g = weak.lock();
      if (!g) continue;
      const int64_t seq = g->collectives_started();
      auto& last = published_[g->name()];
      if (seq != last) changed.emplace_back(g->name(), seq);
      last = seq;
    }
  }
  for (const auto& [name, seq] : changed) store.set(cat("me/progress/", name, "/", env_.rank), std::to_string(seq), timeout);
}

// Ends the job (never returns) when a rank's heartbeat is older than dead_after. Ranks that
// closed their communicator delete their heartbeat, so they never count.
void Communicator::check_heartbeats(launch::StoreClient& store, std::chrono::milliseconds timeout) {
  for (const auto& beat : store.ages("me/hb/", dead_after(), timeout)) {
    const int r = rank_of(beat.key, "me/hb/");
    if (r < 0 || r == env_.rank || r >= env_.world) continue;
    abort_job(cat("rank ", r, " (", hosts_[static_cast<size_t>(r)], ") is dead: no heartbeat for ", seconds(beat.age_ms),
                  " (comm.dead_after_s = ", options_.dead_after_s,
                  "): the process was stopped or killed, or lost its node; at its last heartbeat its latest collective was ",
                  beat.value));
  }
  if (env_.rank != 0)
    if (auto hb0 = store.get("me/hb/0", timeout)) rank0_last_ = *hb0;
}

void Communicator::watchdog_loop() {
  // Its own connection: the main thread may be blocked inside the store or a collective.
  std::unique_ptr<launch::StoreClient> store;
  auto answered = SteadyClock::now();  // the store's last answer
  const auto dead = dead_after();
  std::unique_lock<std::mutex> lock(stop_mutex_);
  while (!stop_) {
    lock.unlock();
    // Each request may take what is left of dead_after since the last answer, so a store that
    // stopped answering is judged on time; without dead_after, the rendezvous timeout.
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - answered);
    const auto timeout = dead.count() > 0 ? std::max(std::chrono::milliseconds(500), dead - silent)
                                          : rendezvous_timeout();
    try {
      if (!store) store = std::make_unique<launch::StoreClient>(store_address_, timeout);
      publish_progress(*store, timeout);
      if (dead.count() > 0) check_heartbeats(*store, timeout);
      answered = SteadyClock::now();
    } catch (const launch::StoreUnavailable& e) {
      const auto since = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - answered);
      if (dead.count() > 0 && since >= dead && env_.rank != 0)
        abort_job(cat("rank 0 (", hosts_[0], ") is dead: the rendezvous store it hosts has not answered for ",
                      seconds(since.count()), " (comm.dead_after_s = ", options_.dead_after_s,
                      "): the process was stopped or killed, or lost its node; at its last heartbeat its latest collective was ",
                      rank0_last_.empty() ? "unknown" : rank0_last_, ". Last error: ", e.what()));
    } catch (const std::exception& e) {
      log::debug("watchdog: ", e.what());  // a refused token cannot happen here: the main connection passed
    }
    lock.lock();
    stop_cv_.wait_for(lock, heartbeat(), [this] { return stop_.load(); });
  }
}

void Communicator::abort_job(const std::string& why) {
  log::error(why, "; aborting this rank's communicators and exiting");
  std::vector<std::shared_ptr<ProcessGroup>> live;
  {
    std::lock_guard<std::mutex> lock(groups_mutex_);
    for (auto& weak : groups_)
      if (auto g = weak.lock()) live.push_back(g);
  }
  for (auto& g : live) g->abort();
  // Rank 0 hosts the store: the other survivors may still be reading it to reach the same verdict.
  if (env_.rank == 0) std::this_thread::sleep_for(2 * heartbeat());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

// Closing: this rank's heartbeat goes (it is not dead, it is done). Rank 0 then keeps the
// store up until the others are done too, or dead, within the collective timeout.
void Communicator::leave() {
  try {
    launch::StoreClient store(store_address_, std::chrono::seconds(5));
    store.erase(cat("me/hb/", env_.rank), std::chrono::seconds(5));
    store.set(cat("me/left/", env_.rank), "1", std::chrono::seconds(5));
    if (env_.rank != 0) return;
    const auto started = SteadyClock::now(), deadline = started + timeout();
    const auto stale = std::max(3 * heartbeat(), std::chrono::milliseconds(1000));
    bool said = false;
    while (SteadyClock::now() < deadline) {
      std::map<int, int64_t> beating;  // rank -> heartbeat age
      for (const auto& b : store.ages("me/hb/", std::chrono::milliseconds(0), std::chrono::seconds(5)))
        if (int r = rank_of(b.key, "me/hb/"); r > 0) beating[r] = b.age_ms;
      std::string waiting;
      for (const auto& [r, age] : beating)
        if (age < stale.count()) waiting += cat(waiting.empty() ? "" : ", ", r);
      if (waiting.empty()) return;
      if (!said && SteadyClock::now() - started > std::chrono::seconds(5)) {
        log::info("waiting for ranks ", waiting, " to finish before closing the rendezvous store");
        said = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (const std::exception& e) {
    log::debug("closing the communicator: ", e.what());
  }
}

std::string Communicator::diagnose(const ProcessGroup& group, int64_t seq) {
  if (env_.world == 1) return "";
  const auto hb = heartbeat();
  std::ostringstream os;
  try {
    launch::StoreClient store(store_address_, std::chrono::seconds(5));
    const auto t = std::chrono::seconds(5);
    // Say we saw it: ranks that failed too are survivors, not the cause.
    store.set(cat("me/failed/", env_.rank), cat(group.name(), " #", seq), t);
    // Let a dead rank's heartbeat go stale before judging it (a peer's death is often seen
    // the moment its socket closes, before its last heartbeat ages).
    std::this_thread::sleep_for(hb * 5 / 2);
    std::map<int, launch::StoreClient::Aged> beats;
    for (auto& b : store.ages("me/hb/", std::chrono::milliseconds(0), t)) beats[rank_of(b.key, "me/hb/")] = b;
    for (int r : group.ranks()) {
      if (r == env_.rank || store.check({cat("me/failed/", r)}, t)) continue;
      const std::string who = cat("\n  rank ", r, " (", hosts_[static_cast<size_t>(r)], "): ");
      auto it = beats.find(r);
      if (it == beats.end()) {
        os << who << (store.check({cat("me/left/", r)}, t) ? "closed its communicator (it finished, or is exiting)"
                                                          : "never sent a heartbeat");
        continue;
      }
      const auto their_text = store.get(cat("me/progress/", group.name(), "/", r), t);
      const int64_t their = their_text ? std::stoll(*their_text) : 0;
      if (it->second.age_ms > 2 * hb.count())
        os << who << "no heartbeat for " << seconds(it->second.age_ms)
           << ": the process exited, was killed or stopped, or lost its node; at its last heartbeat its latest collective was "
           << it->second.value;
      else if (their < seq)
        os << who << "alive but has not reached this collective (it has started " << their << " of " << seq
           << " on group '" << group.name() << "'): it is hung or running something else";
    }
    // Rank 0 hosts the store: stay a moment so the other survivors can still read it.
    if (env_.rank == 0) std::this_thread::sleep_for(hb * 3);
  } catch (const std::exception&) {
    os << "\n  the rendezvous store on rank 0 (" << env_.master_addr << ":" << env_.master_port
       << ") is unreachable: rank 0 has exited";
  }
  const std::string found = os.str();
  return found.empty() ? "\n  (the other ranks of the group are alive, or failed the same way)"
                       : "\n  what the other ranks were doing:" + found;
}

}  // namespace me::comm
