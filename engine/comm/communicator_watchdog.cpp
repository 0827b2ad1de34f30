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
#include <iterator>
#include <map>
#include <set>
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

namespace {

// "node node2 (ranks 2, 3, all of its ranks in the job) is", "ranks 2, 3 (node2) are", "rank 5
// (node3) is": the dead ranks by host; a host all of whose ranks are silent is named as a node
// (it died, or lost its network).
std::string dead_ranks_text(const std::map<std::string, std::vector<int>>& silent_by_host,
                            const std::vector<std::string>& hosts) {
  std::string out;
  for (const auto& [host, ranks] : silent_by_host) {
    std::string list;
    for (int r : ranks) list += cat(list.empty() ? "" : ", ", r);
    const auto on_host = static_cast<size_t>(std::count(hosts.begin(), hosts.end(), host));
    if (!out.empty()) out += "; ";
    if (ranks.size() == on_host && on_host > 1)
      out += cat("node ", host, " (ranks ", list, ", all of its ranks in the job)");
    else
      out += cat(ranks.size() == 1 ? "rank " : "ranks ", list, " (", host, ")");
  }
  const bool one = silent_by_host.size() == 1 && silent_by_host.begin()->second.size() == 1;
  const bool node = silent_by_host.size() == 1 && out.rfind("node ", 0) == 0;
  return out + (one || node ? " is" : " are");
}

// For a failed collective: each node of more than one rank whose ranks have all been silent
// longer than stale_ms, as a line of its own (a whole node gone, not one process).
std::string silent_nodes(const std::map<int, launch::StoreClient::Aged>& beats, const std::vector<std::string>& hosts,
                         int64_t stale_ms) {
  std::map<std::string, std::vector<int>> ranks_of;
  for (size_t r = 0; r < hosts.size(); ++r) ranks_of[hosts[r]].push_back(static_cast<int>(r));
  std::string out;
  for (const auto& [host, ranks] : ranks_of) {
    int64_t newest = -1;
    for (int r : ranks) {
      auto it = beats.find(r);
      if (it == beats.end() || it->second.age_ms <= stale_ms) {
        newest = -1;
        break;
      }
      newest = newest < 0 ? it->second.age_ms : std::min(newest, it->second.age_ms);
    }
    if (newest < 0 || ranks.size() < 2) continue;
    std::string list;
    for (int r : ranks) list += cat(list.empty() ? "" : ", ", r);
    out += cat("\n  node ", host, " (ranks ", list, ", all of its ranks in the job): none has sent a heartbeat for ",
               seconds(newest), ": the node died or lost its network, or all its processes were killed");
  }
  return out;
}

}  // namespace

// Ends the job (never returns) when a rank's heartbeat is older than dead_after. Ranks that
// closed their communicator delete their heartbeat, so they never count. Ranks silent for two
// heartbeats on the dead rank's host are named with it: a node that died takes all its ranks,
// whose heartbeats stop within one interval of each other.
void Communicator::check_heartbeats(launch::StoreClient& store, std::chrono::milliseconds timeout) {
  const auto dead = dead_after();
  std::map<std::string, std::vector<int>> silent_by_host;
  std::set<std::string> dead_hosts;
  const launch::StoreClient::Aged* oldest = nullptr;
  const auto beats = store.ages("me/hb/", std::min(dead, 2 * heartbeat()), timeout);
  for (const auto& beat : beats) {
    const int r = rank_of(beat.key, "me/hb/");
    if (r < 0 || r == env_.rank || r >= env_.world) continue;
    const std::string& host = hosts_[static_cast<size_t>(r)];
    silent_by_host[host].push_back(r);
    if (beat.age_ms < dead.count()) continue;
    dead_hosts.insert(host);
    if (!oldest || beat.age_ms > oldest->age_ms) oldest = &beat;
  }
  if (oldest) {
    for (auto it = silent_by_host.begin(); it != silent_by_host.end();)
      it = dead_hosts.count(it->first) ? std::next(it) : silent_by_host.erase(it);
    for (auto& [host, ranks] : silent_by_host) std::sort(ranks.begin(), ranks.end());
    const int r = rank_of(oldest->key, "me/hb/");
    abort_job(cat(dead_ranks_text(silent_by_host, hosts_), " dead: no heartbeat for ", seconds(oldest->age_ms),
                  " (comm.dead_after_s = ", options_.dead_after_s,
                  "): the process was stopped or killed, or lost its node; at its last heartbeat rank ", r,
                  "'s latest collective was ", oldest->value));
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
    os << silent_nodes(beats, hosts_, 2 * hb.count());
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
