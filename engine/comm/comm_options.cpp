#include "engine/comm/comm_options.h"

#include "engine/core/error.h"

namespace me::comm {

void CommOptions::check() const {
  ME_CHECK(timeout_s > 0 && heartbeat_s > 0, "comm.timeout_s and comm.heartbeat_s must be positive");
  ME_CHECK(rendezvous_timeout_s > 0, "comm.rendezvous_timeout_s must be positive, got ", rendezvous_timeout_s);
  ME_CHECK(dead_after_s >= 0, "comm.dead_after_s must be >= 0 seconds (0: off), got ", dead_after_s);
  // here rather than in the communicator, so that the dry run refuses it too
  ME_CHECK(dead_after_s == 0 || dead_after_s >= 3 * heartbeat_s, "comm.dead_after_s (", dead_after_s,
           ") must be 0 (off) or at least 3 x comm.heartbeat_s (", heartbeat_s,
           "): a rank is declared dead only after several missed heartbeats");
  ME_CHECK(nccl_cta_policy == "default" || nccl_cta_policy == "efficiency" || nccl_cta_policy == "zero",
           "comm.nccl_cta_policy must be default, efficiency or zero, got '", nccl_cta_policy, "'");
  ME_CHECK(cpu_bind == "gpu" || cpu_bind == "none",
           "comm.cpu_bind must be gpu (each rank on its GPU's NUMA-local CPUs) or none, got '", cpu_bind, "'");
}

}  // namespace me::comm
