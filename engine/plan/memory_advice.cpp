#include "engine/plan/memory_advice.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "engine/core/error.h"

namespace me::plan {

std::vector<std::pair<std::string, double>> memory_terms(const StageMemory& s, bool distributed) {
  const bool logits = s.logits_peak > s.layer_peak;
  return {
      {"weights", s.weights},
      {"gradients (main-grad buffer)", s.gradients},
      {!distributed ? std::string("master weights + optimizer state")
                    : s.dp > 1 ? cat("master weights + optimizer state (sharded over dp ", s.dp, ")")
                               : std::string("master weights + optimizer state (dp 1: not sharded)"),
       s.optimizer(distributed)},
      {cat("activations (", s.in_flight, " micro-batch", s.in_flight == 1 ? "" : "es", " in flight)"), s.activations},
      {logits ? "logits and output layer (backward peak)" : "one layer's backward (backward peak)", s.transient()},
      {"cuBLAS workspace, token ids", s.workspace},
      {"CUDA context, NCCL buffers", s.outside - s.symmetric},
      {"allocator slack (5% of its peak)", kFragmentation * s.allocator_peak(distributed)},
  };
}

namespace {

// One candidate: the plan with some knobs turned, and what turning them costs. Costs are a rough
// order of what each change takes from throughput: sharding the optimizer or recomputing only
// the attention core cost little; bf16 gradients cost precision; a smaller micro batch, more
// tensor or pipeline parallelism cost efficiency, more with each step; full recomputation costs
// a third more compute.
struct Knobs {
  int tp, pp;
  int64_t micro;
  std::string recompute;  // "": as the plan has it; "selective"; "full" (every layer)
  bool distributed, bf16_grads, sequence_parallel;
};

double log2_ratio(double a, double b) { return std::log2(a / b); }

double cost_of(const MemoryPlan& from, const Knobs& k) {
  double c = 3.0 * log2_ratio(k.tp, from.tp) + 3.0 * log2_ratio(k.pp, from.pp) +
             2.0 * log2_ratio(static_cast<double>(from.micro_batch), static_cast<double>(k.micro));
  if (k.recompute == "selective") c += 1.0;
  if (k.recompute == "full") c += from.model.recompute == "full" ? 2.0 : 5.0;  // more layers, or all of them
  if (k.distributed != from.distributed_optimizer) c += 1.0;
  if (k.bf16_grads != (from.grad_reduce_dtype == "bf16")) c += 2.0;
  if (k.sequence_parallel != from.sequence_parallel) c += 0.5;
  return c;
}

MemoryChange apply(const MemoryPlan& from, const Knobs& k) {
  MemoryChange ch;
  ch.plan = from;
  auto& p = ch.plan;
  auto& o = ch.overrides;
  if (k.tp != from.tp) o.push_back(cat("parallel.tp=", k.tp)), p.tp = k.tp;
  if (k.pp != from.pp) {
    o.push_back(cat("parallel.pp=", k.pp));
    p.pp = k.pp;
    if (from.pp_first_layers > 0 || from.pp_last_layers > 0) {  // the old split does not carry over
      o.push_back("parallel.pp_first_layers=0");
      o.push_back("parallel.pp_last_layers=0");
      p.pp_first_layers = p.pp_last_layers = 0;
    }
  }
  if (k.micro != from.micro_batch) o.push_back(cat("batch.micro=", k.micro)), p.micro_batch = k.micro;
  if (!k.recompute.empty()) {
    if (k.recompute != from.model.recompute) o.push_back("model.recompute=" + k.recompute);
    if (k.recompute == "full" && from.model.recompute_every != 1) o.push_back("model.recompute_every=1");
    p.model.recompute = k.recompute;
    p.model.recompute_every = 1;
  }
  if (k.distributed != from.distributed_optimizer)
    o.push_back("parallel.distributed_optimizer=true"), p.distributed_optimizer = true;
  if (k.bf16_grads != (from.grad_reduce_dtype == "bf16"))
    o.push_back("parallel.grad_reduce_dtype=bf16"), p.grad_reduce_dtype = "bf16";
  if (k.sequence_parallel != from.sequence_parallel)
    o.push_back("parallel.sequence_parallel=true"), p.sequence_parallel = true;
  // The global batch stays: an unset one (micro x dp) is pinned to the original's.
  if (from.global_batch == 0) p.global_batch = from.global();
  ch.cost = cost_of(from, k);
  return ch;
}

// Every combination of the knobs, each turned no further than it helps: tp doubled up to a node,
// any pp that divides the world, the micro batch halved down to 1, selective or full
// recomputation, and the distributed optimizer, bf16 gradients and sequence parallelism switched on.
std::vector<Knobs> candidates(const MemoryPlan& plan, int gpus_per_node) {
  std::vector<int> tps, pps;
  for (int t = plan.tp; t <= std::max(plan.tp, gpus_per_node); t *= 2) tps.push_back(t);
  for (int p = plan.pp; p <= plan.model.layers && p <= plan.world; ++p)
    if (plan.world % p == 0) pps.push_back(p);
  std::vector<int64_t> micros;
  for (int64_t m = plan.micro_batch; m >= 1; m /= 2) micros.push_back(m);
  std::vector<std::string> recomputes{""};
  if (plan.model.recompute == "none") recomputes.push_back("selective");
  if (plan.model.recompute != "full" || plan.model.recompute_every != 1) recomputes.push_back("full");
  const bool bf16_ok = plan.precision == "bf16" || plan.precision == "fp8";
  std::vector<Knobs> out;
  for (int t : tps)
    for (int p : pps)
      for (int64_t m : micros)
        for (const auto& r : recomputes)
          for (int flags = 0; flags < 8; ++flags) {
            Knobs k{t, p, m, r, plan.distributed_optimizer || (flags & 1), plan.grad_reduce_dtype == "bf16" || (flags & 2),
                    plan.sequence_parallel || (flags & 4)};
            const bool useless = ((flags & 1) && (plan.distributed_optimizer || plan.world / (t * p) == 1)) ||
                                 ((flags & 2) && (plan.grad_reduce_dtype == "bf16" || !bf16_ok)) ||
                                 ((flags & 4) && (plan.sequence_parallel || t == 1));
            if (!useless) out.push_back(k);
          }
  return out;
}

// The cheapest change of `plan` whose busiest stage fits `capacity` (false if none does).
bool search(const MemoryPlan& plan, double capacity, int gpus_per_node, MemoryChange* best) {
  bool found = false;
  for (const auto& k : candidates(plan, gpus_per_node)) {
    auto ch = apply(plan, k);
    if (ch.overrides.empty() || (found && ch.cost > best->cost)) continue;
    try {
      ch.total = estimate_memory(ch.plan).total();
    } catch (const Error&) {
      continue;  // a layout that does not divide
    }
    if (ch.total > capacity) continue;
    if (!found || ch.cost < best->cost || (ch.cost == best->cost && ch.total < best->total)) *best = ch;
    found = true;
  }
  return found;
}

}  // namespace

MemoryVerdict memory_verdict(const MemoryPlan& plan, double gpu_bytes, int gpus_per_node) {
  const auto e = estimate_memory(plan);
  const auto& worst = e.worst();
  MemoryVerdict v;
  v.capacity = gpu_bytes;
  v.total = e.total();
  v.stage = worst.stage;
  v.fits = v.total <= gpu_bytes;
  for (const auto& [name, bytes] : memory_terms(worst, plan.distributed_optimizer))
    if (bytes > v.largest_bytes) v.largest_term = name, v.largest_bytes = bytes;
  if (!v.fits) v.found = search(plan, gpu_bytes, gpus_per_node, &v.change);
  return v;
}

double parse_memory_size(const std::string& text, const std::string& what) {
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  std::string unit;
  for (size_t i = end; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i]))) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  // A bare number is refused, not read as bytes: "--gpu-memory 80" means 80 GB, not 80 bytes.
  ME_CHECK(end == 0 || !unit.empty(), what, ": '", text, "' has no unit; write ", text, "GB (GB = 10^9 bytes) or ",
           text, "GiB (2^30 bytes)");
  double scale = 0;
  if (unit == "b") scale = 1;
  else if (unit == "gb" || unit == "g") scale = 1e9;
  else if (unit == "gib") scale = 1073741824.0;
  else if (unit == "mb" || unit == "m") scale = 1e6;
  else if (unit == "mib") scale = 1048576.0;
  else if (unit == "tb") scale = 1e12;
  ME_CHECK(end > 0 && scale > 0 && value > 0, what, ": expected a size such as 80GB, 81559MiB or 79.6GiB, got '", text,
           "'");
  return value * scale;
}

std::string format_gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  return buf;
}

}  // namespace me::plan
