#include "engine/plan/layout_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/core/error.h"
#include "engine/plan/memory_advice.h"

namespace me::plan {

namespace {

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::vector<std::string> overrides_of(const MemoryPlan& p, bool pin_global) {
  std::vector<std::string> o{cat("parallel.tp=", p.tp), cat("parallel.pp=", p.pp),
                             cat("parallel.sequence_parallel=", p.sequence_parallel ? "true" : "false"),
                             "model.recompute=" + p.model.recompute, cat("batch.micro=", p.micro_batch),
                             cat("parallel.distributed_optimizer=", p.distributed_optimizer ? "true" : "false")};
  if (p.model.recompute == "full") o.push_back("model.recompute_every=1");
  if (pin_global) o.push_back(cat("batch.global=", p.global_batch));
  return o;
}

// The global batch every layout keeps: the recipe's, or (batch.global = 0) micro x dp of the
// recipe's own layout on this world.
int64_t kept_global(const MemoryPlan& base, int world) {
  if (base.global_batch > 0) return base.global_batch;
  ME_CHECK(world % (base.tp * base.pp) == 0, "batch.global is 0 (micro x data-parallel size), which depends on the layout, and ",
           "the recipe's own tp x pp = ", base.tp * base.pp, " does not divide ", world,
           " GPUs: set batch.global so that every layout trains the same batch");
  return base.micro_batch * (world / (base.tp * base.pp));
}

}  // namespace

std::string describe_layout_choice(const MemoryPlan& p) {
  std::string s = cat("tp ", p.tp, " x pp ", p.pp, " x dp ", p.dp());
  if (p.sequence_parallel) s += ", sequence parallel";
  s += ", recompute " + p.model.recompute + cat(", micro ", p.micro_batch);
  if (p.distributed_optimizer) s += ", distributed optimizer";
  return s;
}

PlanResult search_layouts(const PlanRequest& r) {
  ME_CHECK(r.nodes >= 1, "--nodes must be a positive number, got ", r.nodes);
  ME_CHECK(r.gpus_per_node >= 1, "--gpus-per-node must be a positive number, got ", r.gpus_per_node);
  const int world = r.nodes * r.gpus_per_node;
  MemoryPlan base = r.base;
  base.world = world;
  base.global_batch = kept_global(r.base, world);
  base.pp_first_layers = base.pp_last_layers = 0;  // a recipe's split belongs to its own pp
  const bool pin_global = r.base.global_batch == 0;

  PlanResult out;
  out.capacity = r.gpu_bytes > 0 ? r.gpu_bytes : r.profile.memory_bytes;
  double smallest = -1;
  for (int tp = 1; tp <= r.gpus_per_node; tp *= 2) {
    if (world % tp) continue;
    for (int pp = 1; pp <= world / tp && pp <= base.model.layers; ++pp) {
      if ((world / tp) % pp) continue;
      const int dp = world / (tp * pp);
      for (int64_t micro = 1; micro <= 64; micro *= 2) {
        if (base.global_batch % (micro * dp)) continue;
        for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp)
          for (const char* recompute : {"none", "selective", "full"})
            for (int distributed = 0; distributed <= (dp > 1 ? 1 : 0); ++distributed) {
              LayoutCandidate c;
              c.plan = base;
              auto& p = c.plan;
              p.tp = tp, p.pp = pp, p.micro_batch = micro, p.sequence_parallel = sp != 0;
              p.model.recompute = recompute;
              p.model.recompute_every = 1;
              p.distributed_optimizer = distributed != 0;
              try {
                c.memory = estimate_memory(p).total();
                c.time = estimate_step_time(p, r.profile, r.gpus_per_node);
              } catch (const Error&) {
                continue;  // heads, groups, layers or the vocabulary do not divide
              }
              ++out.considered;
              c.overrides = overrides_of(p, pin_global);
              if (smallest < 0 || c.memory < smallest) smallest = c.memory, out.smallest = c;
              if (c.memory > out.capacity) {
                ++out.over_memory;
                continue;
              }
              out.fitting.push_back(std::move(c));
            }
      }
    }
  }
  ME_CHECK(out.considered > 0, "no layout of ", base.model.describe(), " divides ", world, " GPUs with batch.global ",
           base.global_batch, ": check that the heads, query groups and layers allow some tp and pp");
  std::stable_sort(out.fitting.begin(), out.fitting.end(), [](const LayoutCandidate& a, const LayoutCandidate& b) {
    return a.time.total != b.time.total ? a.time.total < b.time.total : a.memory < b.memory;
  });
  return out;
}

LayoutCandidate best_layout(const PlanRequest& r) {
  const auto result = search_layouts(r);
  if (!result.fitting.empty()) return result.fitting.front();
  const auto& s = result.smallest;
  const auto e = estimate_memory(s.plan);
  std::string term;
  double bytes = 0;
  for (const auto& [name, b] : memory_terms(e.worst(), s.plan.distributed_optimizer))
    if (b > bytes) term = name, bytes = b;
  std::string would_fit = "no layout fits even 64 times as many nodes: a smaller model or micro batch, or GPUs with more memory";
  for (int nodes = r.nodes * 2; nodes <= r.nodes * 64; nodes *= 2) {
    PlanRequest more = r;
    more.nodes = nodes;
    try {
      const auto bigger = search_layouts(more);
      if (bigger.fitting.empty()) continue;
      would_fit = cat("it would fit on ", nodes, " nodes of ", r.gpus_per_node, " GPUs (",
                      describe_layout_choice(bigger.fitting.front().plan), ": ", format_gb(bigger.fitting.front().memory), ")");
      break;
    } catch (const Error&) {
      continue;  // a batch that does not divide the larger world
    }
  }
  fail("no layout of ", s.plan.model.describe(), " fits ", r.nodes, " node", r.nodes == 1 ? "" : "s", " of ",
       r.gpus_per_node, " GPUs with ", format_gb(result.capacity), " each: of ", result.considered,
       " layouts, the smallest (", describe_layout_choice(s.plan), ") needs ", format_gb(s.memory),
       " on its busiest stage, of which the largest term is ", term, " (", format_gb(bytes), "); ", would_fit);
}

std::string plan_report(const PlanRequest& r, const PlanResult& result, int top, int64_t samples) {
  const auto& b = r.base;
  const int world = r.nodes * r.gpus_per_node;
  std::string out = cat("plan: ", b.model.describe(), ", ", b.precision, ", ", result.fitting.empty() ? b.global_batch : result.fitting.front().plan.global(),
                        " samples per step, on ", r.nodes, " node", r.nodes == 1 ? "" : "s", " x ", r.gpus_per_node,
                        " GPUs = ", world, "\n");
  out += cat("profile: ", r.profile.name, " (", r.profile.gpu, ", ", format_gb(result.capacity), " per GPU, bf16 peak ",
             fixed(r.profile.matmul_tflops, 0), " TFLOP/s); ", r.profile.source, "\n");
  out += cat(result.considered, " layouts divide; ", result.over_memory, " do not fit in memory; ",
             result.fitting.size(), " ranked by estimated step time (tensor parallelism kept inside a node):\n\n");
  const int shown = std::min<int>(top, static_cast<int>(result.fitting.size()));
  for (int i = 0; i < shown; ++i) {
    const auto& c = result.fitting[static_cast<size_t>(i)];
    out += cat("#", i + 1, "  ", describe_layout_choice(c.plan), "\n");
    out += cat("    step ", fixed(c.time.total / 1e3, 3), " s, ", fixed(c.time.tokens_per_s, 0), " tokens/s, ",
               fixed(c.time.tflops_per_gpu, 0), " TFLOP/s per GPU, MFU ", fixed(100 * c.time.mfu, 1), "%, memory ",
               format_gb(c.memory), " of ", format_gb(result.capacity));
    if (samples > 0) {
      const double iters = std::ceil(static_cast<double>(samples) / static_cast<double>(c.plan.global()));
      out += cat(", ", fixed(iters * c.time.total / 1e3 / 86400, 1), " days for ", samples, " samples");
    }
    out += "\n    " + describe_terms(c.time) + "\n";
    std::string o;
    for (const auto& s : c.overrides) o += (o.empty() ? "" : " ") + s;
    out += "    overrides: " + o + "\n";
  }
  if (shown >= 2) {
    const auto& a = result.fitting[0].time;
    const auto& n = result.fitting[1].time;
    const std::pair<const char*, double> diffs[] = {
        {"GEMM time", n.gemm - a.gemm},           {"attention time", n.attention - a.attention},
        {"other kernels' time", n.other - a.other}, {"exposed TP communication", n.tp_comm - a.tp_comm},
        {"host-bound time", n.host - a.host},      {"pipeline bubble", n.bubble - a.bubble},   {"pipeline sends", n.pp_comm - a.pp_comm},
        {"exposed DP communication", n.dp_comm - a.dp_comm}, {"optimizer step", n.optimizer - a.optimizer}};
    const auto* most = &diffs[0];
    for (const auto& d : diffs)
      if (d.second > most->second) most = &d;
    out += cat("\nwhy #1: ", fixed(n.total - a.total, 1), " ms per step faster than #2 (",
               fixed(100 * (n.total / a.total - 1), 1), "%), mostly its ", most->first, ": ", fixed(most->second, 1),
               " ms less");
    const double saved = result.fitting[1].memory - result.fitting[0].memory;
    out += saved >= 0.05e9 ? cat("; it also needs ", format_gb(saved), " less memory\n") : "\n";
  }
  if (shown >= 1 && result.fitting.front().plan.tp > 1 && r.nodes > 1) {
    // The same layout with its tensor-parallel groups spread over nodes: the collectives of
    // every layer then run on the inter-node link.
    const auto& best = result.fitting.front();
    const auto across = estimate_step_time(best.plan, r.profile, std::max(1, best.plan.tp / 2));
    out += cat("\ntensor parallelism across nodes: the same layout with each tp group split over 2 nodes would put every layer's ",
               best.plan.sequence_parallel ? "all-gathers and reduce-scatters" : "all-reduces", " on the inter-node link (",
               fixed(r.profile.inter_node.all_gather.at(64e6), 0), " GB/s per GPU against ",
               fixed(r.profile.intra_node.all_gather.at(64e6), 0), " on NVLink for 64 MB): exposed TP communication ",
               fixed(across.tp_comm / 1e3, 2), " s per step instead of ", fixed(best.time.tp_comm / 1e3, 2),
               " s, a step of ", fixed(across.total / 1e3, 2), " s instead of ", fixed(best.time.total / 1e3, 2),
               " s. The slowest link sets the step time, so the planner keeps tp inside a node and puts pp and dp across nodes.\n");
  }
  return out;
}

}  // namespace me::plan
