// The communicators' options: the recipe's `comm` section, owned here and composed by the
// recipe (engine/config/recipe.h). The defaults are those of bindings/lua/fields.lua, which has
// each field's help (tests/unit/test_recipe_fields.cpp checks that they agree). No LibTorch.
#pragma once
#include <string>
#include <type_traits>

namespace me::comm {

struct CommOptions {
  std::string backend = "auto";  // gloo | nccl | auto (nccl for cuda devices, gloo for cpu)
  double timeout_s = 600.0;      // any one collective
  double rendezvous_timeout_s = 300.0;  // the ranks' wait for each other at the start
  double heartbeat_s = 1.0;      // how often each rank publishes its heartbeat and progress
  // A rank whose heartbeat has been silent this long is dead (SIGKILL, SIGSTOP, a lost node):
  // every other rank aborts its communicators and exits, naming it. 0: off. A rank that is
  // merely slow keeps its heartbeat and is never declared dead; `timeout_s` bounds that case.
  double dead_after_s = 60.0;
  // NCCL's CTA policy for every communicator (NCCL >= 2.27): "default" leaves it to NCCL (and
  // NCCL_CTA_POLICY), "efficiency" asks for fewer thread blocks per collective, "zero" (2.28) for
  // none where it can (copy-engine all-gathers into buffers from ProcessGroup::empty_symmetric).
  std::string nccl_cta_policy = "default";
  // Where each GPU rank's threads run: "gpu", the CPUs local to its GPU (launch/cpu_affinity.h),
  // within what Slurm or taskset already allows; "none", wherever the process was started.
  std::string cpu_bind = "gpu";

  // Not recipe fields: what the maker of a communicator says besides.
  std::string device = "cpu";  // the recipe's device: cuda picks NCCL under "auto"

  // Throws me::Error naming the comm field and what it expects; checked on every backend, so a
  // typo fails on the CPU too (NCCL then checks what its version supports).
  void check() const;
};

// The recipe's fields, by name, in fields.lua's order.
template <class S, class V, std::enable_if_t<std::is_same_v<std::remove_const_t<S>, CommOptions>, int> = 0>
void visit_fields(S& c, V&& v) {
  v("backend", c.backend);
  v("timeout_s", c.timeout_s);
  v("rendezvous_timeout_s", c.rendezvous_timeout_s);
  v("heartbeat_s", c.heartbeat_s);
  v("dead_after_s", c.dead_after_s);
  v("nccl_cta_policy", c.nccl_cta_policy);
  v("cpu_bind", c.cpu_bind);
}

}  // namespace me::comm
