#include "engine/plan/memory_report.h"

#include <cstdio>
#include <sstream>

#include "engine/plan/layout_report.h"
#include "engine/core/error.h"

namespace me::plan {
namespace {

std::string with_commas(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

// 39.09B, 354.9M: the count in the size table's style.
std::string short_count(int64_t n) {
  char buf[32];
  const double v = static_cast<double>(n);
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", v / 1e9);
  else std::snprintf(buf, sizeof buf, "%.1fM", v / 1e6);
  return buf;
}

std::string joined(const std::vector<std::string>& words) {
  std::string s;
  for (const auto& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

std::string pad(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string right(const std::string& s, size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

// The stages a table shows: the first, the last, and the busiest when it is neither.
std::vector<const plan::StageMemory*> shown_stages(const plan::MemoryEstimate& e) {
  std::vector<const plan::StageMemory*> out{&e.first()};
  if (e.stages.size() > 1) out.push_back(&e.last());
  const auto* worst = &e.worst();
  if (worst != &e.first() && worst != &e.last()) out.insert(out.begin() + 1, worst);
  return out;
}

std::string stage_name(const plan::MemoryEstimate& e, const plan::StageMemory& s) {
  if (e.stages.size() == 1) return "whole model";
  return cat("stage ", s.stage + 1, " of ", e.stages.size());
}

std::string plan_summary(const plan::MemoryPlan& p) {
  return cat("tp ", p.tp, " x pp ", p.pp, " x dp ", p.dp(), p.sequence_parallel && p.tp > 1 ? ", sequence parallel" : "",
             ", micro batch ", p.micro_batch, " x ", p.micro_batches(), " per step, seq ", p.model.seq, ", ", p.precision,
             p.precision == "fp32" ? "" : cat(" (", p.grad_reduce_dtype, " gradients)"),
             p.model.recompute == "none" ? "" : cat(", recompute ", p.model.recompute),
             p.model.recompute == "full" && p.model.recompute_every > 1 ? cat(" every ", p.model.recompute_every) : "",
             p.distributed_optimizer ? ", distributed optimizer" : "");
}

std::string verdict_text(const plan::MemoryPlan& plan, const plan::MemoryVerdict& v, int gpus_per_node) {
  std::ostringstream os;
  const auto percent = static_cast<int>(100.0 * v.total / v.capacity + 0.5);
  if (v.fits) {
    os << "verdict: fits: the busiest GPU (pipeline stage " << v.stage + 1 << ") needs " << plan::format_gb(v.total)
       << " of " << plan::format_gb(v.capacity) << " (" << percent << "%)";
    return os.str();
  }
  os << "verdict: does NOT fit: pipeline stage " << v.stage + 1 << " needs " << plan::format_gb(v.total)
     << " per GPU, more than " << plan::format_gb(v.capacity) << "; its largest term is " << v.largest_term << " ("
     << plan::format_gb(v.largest_bytes) << ")";
  if (v.found) {
    os << "\n  smallest change that fits (then " << plan::format_gb(v.change.total)
       << " per GPU): " << joined(v.change.overrides);
    return os.str();
  }
  // Nothing fits on these GPUs: how many it would take.
  for (int factor = 2; factor <= 16; factor *= 2) {
    auto more = plan;
    more.world = plan.world * factor;
    if (more.global_batch == 0) more.global_batch = plan.global();
    const auto w = plan::memory_verdict(more, v.capacity, gpus_per_node);
    if (!w.fits && !w.found) continue;
    os << "\n  no change of tp (up to " << gpus_per_node << "), pp, recomputation, the distributed optimizer, bf16 "
       << "gradients or the micro batch fits on " << plan.world << " GPUs; on " << more.world << " GPUs (--world "
       << more.world << "): " << (w.fits ? std::string("it fits as it is") : joined(w.change.overrides));
    return os.str();
  }
  os << "\n  nothing fits even on " << plan.world * 16 << " GPUs: a smaller model or sequence";
  return os.str();
}

}  // namespace

plan::MemoryPlan memory_plan(const config::Recipe& spec, int world) {
  plan::MemoryPlan p;
  const auto& par = spec.parallel;
  p.model = spec.model;
  p.world = world;
  p.tp = static_cast<int>(par.tp);
  p.pp = static_cast<int>(par.pp);
  p.sequence_parallel = par.sequence_parallel;
  p.distributed_optimizer = par.distributed_optimizer;
  p.pp_split = par.pp_split;
  p.pp_first_layers = par.pp_first_layers;
  p.pp_last_layers = par.pp_last_layers;
  p.micro_batch = spec.batch.micro;
  p.global_batch = spec.batch.global;
  p.precision = spec.precision;
  p.grad_reduce_dtype = par.grad_reduce_dtype;
  p.optimizer = spec.optim.kind;
  p.deferred_wgrads = par.pp_deferred_wgrads;
  p.grad_accumulation_fusion = par.grad_accumulation_fusion;
  p.symmetric_buffers = par.symmetric_buffers;
  p.tp_symmetric_mb = par.tp_symmetric_mb;
  p.tp_copy_engine = par.tp_backend("cuda") == "copy_engine";  // estimated for the GPU, as below
  // Estimated for the GPU (fused attention, the engine's kernels) even for a recipe that says
  // device = "cpu": the question is whether it fits the cluster's GPUs.
  p.fused_attention = p.fused_kernels = true;
  return p;
}

std::string parameter_report(const plan::MemoryPlan& plan) {
  std::ostringstream os;
  const int64_t total = plan.model.parameter_count(plan.tp);
  os << "parameters: " << with_commas(total) << " (" << short_count(total) << ") in the model";
  const auto [first, last] = plan.stage_split();
  for (int s = 0; s < plan.pp; ++s) {
    const model::PipelineStage stage{s, plan.pp, first, last};
    const auto [start, layers] = stage.layer_range(plan.model.layers);
    const int64_t whole = plan::stage_parameters(plan.model, plan.tp, stage, false);
    const int64_t mine = plan::stage_parameters(plan.model, plan.tp, stage, true);
    os << "\n  " << (plan.pp == 1 ? std::string("whole model") : cat("pipeline stage ", s + 1, " of ", plan.pp)) << ": layers "
       << start << "-" << start + layers - 1 << (stage.first() ? " + embeddings" : "")
       << (stage.last() ? (plan.model.tie_embeddings && !stage.first() ? " + output (tied embedding copy)" : " + output")
                        : "")
       << ": " << with_commas(whole) << " (" << short_count(whole) << "), " << with_commas(mine) << " on each of its "
       << plan.tp << " tensor-parallel GPU" << (plan.tp == 1 ? "" : "s");
  }
  return os.str();
}

std::string memory_report(const plan::MemoryPlan& plan, double gpu_bytes, int gpus_per_node) {
  const auto e = plan::estimate_memory(plan);
  const auto stages = shown_stages(e);
  const bool dist = plan.distributed_optimizer;
  constexpr size_t kLabel = 56, kColumn = 16;
  std::ostringstream os;
  os << "memory per GPU (estimate; GB = 10^9 bytes; " << plan_summary(plan) << ")\n";
  os << pad("", kLabel);
  for (const auto* s : stages) os << right(stage_name(e, *s), kColumn);
  std::vector<std::vector<std::pair<std::string, double>>> terms;
  for (const auto* s : stages) terms.push_back(plan::memory_terms(*s, dist));
  auto line = [&](const std::string& label, auto value) {
    os << "\n  " << pad(label, kLabel - 2);
    for (const auto* s : stages) os << right(value(*s), kColumn);
  };
  // The allocator's terms, its peak (what the run's last line reports), then what lies outside it.
  constexpr size_t kAllocatorTerms = 6;
  for (size_t row = 0; row < terms.front().size(); ++row) {
    if (row == kAllocatorTerms)
      line("= LibTorch's allocator peak (what a run reports)",
           [&](const plan::StageMemory& s) { return plan::format_gb(s.allocator_peak(dist)); });
    os << "\n  " << pad((row < kAllocatorTerms ? "" : "+ ") + terms.front()[row].first, kLabel - 2);
    for (const auto& t : terms) os << right(plan::format_gb(t[row].second), kColumn);
  }
  line("= total", [&](const plan::StageMemory& s) { return plan::format_gb(s.total(dist)); });
  line(dist ? "  (without the distributed optimizer)" : "  (with the distributed optimizer)",
       [&](const plan::StageMemory& s) { return plan::format_gb(s.total(!dist)); });
  line("activations per micro-batch",
       [&](const plan::StageMemory& s) { return plan::format_gb(s.activations_per_micro); });
  os << "\n" << verdict_text(plan, plan::memory_verdict(plan, gpu_bytes, gpus_per_node), gpus_per_node);
  return os.str();
}

std::string dry_run_report(const config::Recipe& spec, const DryRunOptions& opts) {
  const auto plan = memory_plan(spec, opts.world);
  plan.validate();
  std::ostringstream os;
  os << plan::describe_layout(comm::RankGrid(opts.world, plan.tp, plan.pp), opts.gpus_per_node) << "\n";
  os << parameter_report(plan) << "\n";
  if (spec.device == "cpu") os << "(the recipe says device = \"cpu\"; the estimate is for its run on CUDA GPUs)\n";
  os << "deterministic: "
     << (spec.train.deterministic ? "yes (train.deterministic: the same bits every run and after a resume; fixed "
                                    "cuBLAS workspaces, NCCL Ring/Simple, FlashAttention's deterministic backward; its "
                                    "cost on one H100 is in bench/RESULTS.md)"
                                  : "no (train.deterministic = false: runs agree to rounding, not to the bit)")
     << "\n";
  os << memory_report(plan, opts.gpu_bytes, opts.gpus_per_node) << "\n";
  // Rank 0 is the first stage's first GPU: the line to hold against the run's own at its end.
  const auto e = plan::estimate_memory(plan);
  os << "predicted peak GPU memory on rank 0: "
     << static_cast<int64_t>(e.first().allocator_peak(plan.distributed_optimizer) / 1048576.0 + 0.5)
     << " MiB allocated by tensors (LibTorch's allocator peak, pipeline stage 1)";
  return os.str();
}

namespace {

// LibTorch's message up to its allocator statistics: "CUDA out of memory. Tried to allocate 2.00
// GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.23 GiB is free. ..."
std::string oom_detail(const std::string& what) {
  std::string s = what.substr(0, what.find('\n'));
  for (const char* cut : {" Including non-PyTorch memory", " Of the allocated memory", " If reserved"})
    if (const auto at = s.find(cut); at != std::string::npos) s.resize(at);
  const std::string prefix = "CUDA out of memory. ";
  if (s.rfind(prefix, 0) == 0) s = s.substr(prefix.size());
  while (!s.empty() && (s.back() == '.' || s.back() == ' ')) s.pop_back();  // the report adds its own
  return s.size() > 300 ? s.substr(0, 300) + "..." : s;
}

// "total capacity of 79.19 GiB" in LibTorch's message, in bytes (0 when absent).
double capacity_in(const std::string& what) {
  const std::string key = "total capacity of ";
  const auto at = what.find(key);
  if (at == std::string::npos) return 0;
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(what.substr(at + key.size()), &used);
  } catch (const std::exception&) {
    return 0;
  }
  const std::string unit = what.substr(at + key.size() + used, 4);
  return value * (unit == " GiB" ? 1073741824.0 : unit == " MiB" ? 1048576.0 : 0.0);
}

}  // namespace

std::string oom_report(const config::Recipe& spec, int world, int rank, double gpu_bytes, const std::string& what) {
  if (gpu_bytes <= 0) gpu_bytes = capacity_in(what);
  if (gpu_bytes <= 0) gpu_bytes = 80e9;
  const auto detail = oom_detail(what);
  std::ostringstream os;
  os << "CUDA out of memory on rank " << rank << (detail.empty() ? "" : " (" + detail + ")") << ".\n";
  try {
    const auto plan = memory_plan(spec, world);
    os << memory_report(plan, gpu_bytes, 8);
    const auto v = plan::memory_verdict(plan, gpu_bytes, 8);
    if (v.fits) {
      // The estimate fits, yet the GPU ran out: ask for a change that cuts the need by a tenth.
      const auto cut = plan::memory_verdict(plan, 0.9 * v.total, 8);
      os << "\n  the estimate fits, so something it does not count took the rest (another process on this GPU, "
         << "fragmentation: try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)";
      if (cut.found) os << "; a change that needs a tenth less: " << joined(cut.change.overrides);
    }
  } catch (const std::exception& e) {
    os << "(no estimate for this run: " << e.what() << ")";
  }
  return os.str();
}

}  // namespace me::plan
