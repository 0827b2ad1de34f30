#include "engine/comm/communicator.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "engine/comm/gloo_group.h"
#include "engine/comm/job_store.h"
#include "engine/launch/job_token.h"
#include "engine/comm/nccl_group.h"
#include "engine/core/error.h"
#include "engine/core/format.h"
#include "engine/core/log.h"

namespace me::comm {
namespace {

std::string this_host() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How often a rank waiting at the rendezvous says so: every 15 s, more often for short limits.
milliseconds progress_every(milliseconds limit) {
  return std::clamp(limit / 4, milliseconds(1000), milliseconds(15000));
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// "1, 3, 5" (the first 10, then "and N more").
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 10; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return ranks.size() > 10 ? s + cat(" and ", ranks.size() - 10, " more") : s;
}

// Waits until every rank has set prefix + its rank. A missing rank would otherwise be minutes
// of silence: rank 0 says every few seconds who has not joined, and after `limit`
// (comm.rendezvous_timeout_s) every rank fails naming them.
void wait_for_ranks(c10d::Store& store, const std::string& prefix, const launch::LaunchEnv& env, milliseconds limit) {
  std::vector<std::string> keys;
  for (int r = 0; r < env.world; ++r) keys.push_back(prefix + std::to_string(r));
  const auto start = Clock::now();
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(limit - (Clock::now() - start));
    try {
      store.wait(keys, std::clamp(left, milliseconds(1), progress_every(limit)));
      return;
    } catch (const launch::StoreUnavailable&) {
      throw;  // the store itself is gone: the watchdog's business, not a missing rank
    } catch (const std::exception&) {
    }
    std::vector<int> missing;
    for (int r = 0; r < env.world; ++r)
      if (!store.check({keys[static_cast<size_t>(r)]})) missing.push_back(r);
    if (missing.empty()) return;
    const auto joined = cat("(", env.world - static_cast<int>(missing.size()), " of ", env.world, " joined)");
    if (Clock::now() - start >= limit)
      fail("rank ", env.rank, ": rank", missing.size() == 1 ? " " : "s ", rank_list(missing), " did not join within ",
           human::seconds(seconds_since(start)), " ", joined,
           ": not started, or died at start (comm.rendezvous_timeout_s sets how long to wait)");
    if (env.rank == 0)
      log::warn("waiting for ranks ", rank_list(missing), " ", joined, ", ", human::seconds(seconds_since(start)),
                " of comm.rendezvous_timeout_s = ", human::seconds(limit.count() / 1000.0));
  }
}

}  // namespace

Communicator::Communicator(launch::LaunchEnv env, CommOptions options) : env_(std::move(env)), options_(std::move(options)) {
  options_.check();
  const bool cuda = options_.device.rfind("cuda", 0) == 0;
  backend_ = options_.backend == "auto" ? (cuda ? "nccl" : "gloo") : options_.backend;
  ME_CHECK(backend_ == "gloo" || backend_ == "nccl", "unknown communication backend '", backend_,
           "': expected gloo, nccl or auto");
  if (backend_ == "nccl") {
    ME_CHECK(cuda, "the nccl backend drives CUDA tensors: set device=cuda (or backend=gloo for CPU)");
    cuda_device_ = select_cuda_device(env_.local_rank, env_.local_world, options_.cpu_bind == "gpu", &cpu_binding_);
  }
  log::set_rank(env_.rank, env_.world);
  if (!cpu_binding_.empty() && env_.rank == 0 && env_.world > 1) log::info("rank 0's CPUs (comm.cpu_bind = \"", options_.cpu_bind, "\"): ", cpu_binding_);
  else if (!cpu_binding_.empty()) log::debug("CPUs (comm.cpu_bind = \"", options_.cpu_bind, "\"): ", cpu_binding_);
  if (env_.world == 1)
    store_ = c10::make_intrusive<c10d::HashStore>();
  else
    start_store();
  for (const auto& entry : all_gather_object(this_host() + "\t" + std::to_string(cuda_device_))) {
    const auto tab = entry.rfind('\t');
    hosts_.push_back(entry.substr(0, tab));
    gpus_.push_back(std::stoi(entry.substr(tab + 1)));
  }

  std::vector<int> all(static_cast<size_t>(env_.world));
  for (int r = 0; r < env_.world; ++r) all[static_cast<size_t>(r)] = r;
  world_ = new_group("world", all);
  if (env_.world > 1) watchdog_ = std::thread([this] { watchdog_loop(); });
}

// Rank 0 serves the store on MASTER_ADDR's interface; every rank (rank 0 too) joins it with
// the job token.
void Communicator::start_store() {
  const launch::JobToken token = launch::job_token(env_);
  log::debug("job token: ", token.origin);
  if (env_.rank == 0) {
    launch::StoreServerOptions o;
    o.host = env_.master_addr;
    o.port = env_.master_port;
    o.token = token.value;
    o.exclude_loopback = env_.world > env_.local_world;  // other nodes must reach it
    o.log = [](const std::string& line) { log::warn(line); };
    server_ = std::make_unique<launch::StoreServer>(o);
    log::debug("rendezvous store on ", server_->address(), ":", server_->port());
  }
  store_address_ = launch::StoreAddress{env_.master_addr, env_.master_port, token.value,
                                cat("rank ", env_.rank, " (", this_host(), ")")};
  const milliseconds limit = rendezvous_timeout();
  const auto start = Clock::now();
  while (!store_) {  // in slices, saying every few seconds that rank 0's store is awaited
    const auto left = std::chrono::duration_cast<milliseconds>(limit - (Clock::now() - start));
    try {
      auto store = c10::make_intrusive<JobStore>(store_address_, limit,
                                                 std::clamp(left, milliseconds(1), progress_every(limit)));
      // Gloo listens where this rank reaches the store: an address the other ranks can reach.
      // Not the hostname, which may resolve nowhere, or to 127.0.1.1 (Debian's /etc/hosts).
      local_host_ = store->client().local_host();
      store_ = store;
    } catch (const launch::StoreUnavailable& e) {
      if (Clock::now() - start < limit) {
        log::warn("rank ", env_.rank, ": waiting for rank 0's rendezvous store at ", env_.master_addr, ":",
                  env_.master_port, ", ", human::seconds(seconds_since(start)), " of comm.rendezvous_timeout_s = ",
                  human::seconds(limit.count() / 1000.0));
        continue;
      }
      fail("rank ", env_.rank, ": no rendezvous store after ", human::seconds(seconds_since(start)),
           " (comm.rendezvous_timeout_s): ", e.what(),
           env_.rank == 0 ? "" : " (rank 0 hosts the store: did it start? is MASTER_ADDR/MASTER_PORT the same on every rank?)");
    } catch (const std::exception& e) {
      fail("rank ", env_.rank, ": ", e.what());
    }
  }
}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (env_.world > 1) leave();
}

std::shared_ptr<ProcessGroup> Communicator::new_group(const std::string& name, const std::vector<int>& ranks) {
  // A name made again (a second grid, say) gets a fresh store prefix. Every rank counts every
  // creation, member or not, so the suffixes agree wherever the group is joined.
  const int64_t generation = generations_[name]++;
  if (std::find(ranks.begin(), ranks.end(), env_.rank) == ranks.end()) return nullptr;
  const std::string unique = generation == 0 ? name : cat(name, "@", generation);
  std::shared_ptr<ProcessGroup> g;
  if (backend_ == "gloo")
    g = make_gloo_group(unique, ranks, env_.rank, store_, timeout(), local_host_);
  else
    g = make_nccl_group(unique, ranks, env_.rank, store_, timeout(), cuda_device_, options_.nccl_cta_policy);
  g->set_diagnose([this](const ProcessGroup& group, int64_t seq) { return diagnose(group, seq); });
  std::lock_guard<std::mutex> lock(groups_mutex_);
  groups_.push_back(g);
  return g;
}

std::vector<std::string> Communicator::all_gather_object(const std::string& mine) {
  const int64_t round = ++object_round_;
  const std::string prefix = cat("me/obj/", round, "/");
  store_->set(prefix + std::to_string(env_.rank), store_bytes(mine));
  // The first round is the rendezvous at the start: there, say who is missing while waiting.
  if (round == 1) wait_for_ranks(*store_, prefix, env_, rendezvous_timeout());
  std::vector<std::string> out(static_cast<size_t>(env_.world));
  for (int r = 0; r < env_.world; ++r) {
    const std::string key = prefix + std::to_string(r);
    try {
      store_->wait({key}, rendezvous_timeout());
    } catch (const std::exception&) {
      fail("rank ", env_.rank, ": rank ", r, " did not publish '", key, "' within ",
           human::seconds(options_.rendezvous_timeout_s), " (it has not started, or died)");
    }
    out[static_cast<size_t>(r)] = store_text(store_->get(key));
  }
  return out;
}

ParallelGroups make_parallel_groups(Communicator& comm, int tp, int pp, int cp) {
  ParallelGroups pg{RankGrid(comm.world_size(), tp, pp, cp), {}, {}, {}, {}, {}, {}, {}, {}, {}};
  const int me_rank = comm.rank();
  pg.coords = pg.grid.coords(me_rank);
  // Every rank walks every group of every kind in the same order; each joins only its own.
  auto join = [&](const char* kind, const std::vector<RankGroup>& groups) {
    std::shared_ptr<ProcessGroup> mine;
    for (size_t i = 0; i < groups.size(); ++i) {
      auto g = comm.new_group(cat(kind, "-", i), groups[i]);
      if (g) mine = g;
    }
    return mine;
  };
  pg.tp = join("tp", pg.grid.all_tp_groups());
  pg.cp = join("cp", pg.grid.all_cp_groups());
  pg.dp = join("dp", pg.grid.all_dp_groups());
  pg.pp = join("pp", pg.grid.all_pp_groups());
  pg.model_parallel = join("mp", pg.grid.all_model_parallel_groups());
  std::vector<RankGroup> embedding;
  for (const auto& pipe : pg.grid.all_pp_groups()) {
    RankGroup e{pipe.front()};
    if (pipe.back() != pipe.front()) e.push_back(pipe.back());
    embedding.push_back(e);
  }
  pg.embedding = join("emb", embedding);

  // Tensor parallelism talks at every layer: it must stay on one node's NVLink.
  const auto& hosts = comm.hosts();
  for (const auto& g : pg.grid.all_tp_groups()) {
    for (int r : g) {
      if (hosts[static_cast<size_t>(r)] != hosts[static_cast<size_t>(g.front())]) {
        pg.warnings.push_back(cat("tensor-parallel group of ranks ", g.front(), "..", g.back(), " spans hosts ",
                                  hosts[static_cast<size_t>(g.front())], " and ", hosts[static_cast<size_t>(r)],
                                  ": every layer's all-reduce will cross the network; use tp <= GPUs per node"));
        break;
      }
    }
  }
  std::ostringstream os;
  os << "layout: world " << comm.world_size() << " = tp " << tp << " x cp " << cp << " x dp " << pg.grid.layout().dp()
     << " x pp " << pp << ", backend " << comm.backend() << "\n";
  os << "  rank  host                  gpu   tp  cp  dp  pp";
  for (int r = 0; r < comm.world_size(); ++r) {
    const auto c = pg.grid.coords(r);
    char line[160];
    const int gpu = comm.gpus()[static_cast<size_t>(r)];
    std::snprintf(line, sizeof line, "\n  %4d  %-20s  %4s  %2d  %2d  %2d  %2d", r, hosts[static_cast<size_t>(r)].c_str(),
                  gpu < 0 ? "cpu" : std::to_string(gpu).c_str(), c.tp, c.cp, c.dp, c.pp);
    os << line;
  }
  pg.layout_table = os.str();
  return pg;
}

}  // namespace me::comm
