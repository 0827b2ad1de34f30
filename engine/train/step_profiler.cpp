#include "engine/train/step_profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/core/torch_compat.h"

namespace me::train {
namespace {

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

const char* const kCommunication = "communication (NCCL)";

// The kind of a GPU kernel, from its (demangled) name.
std::string kernel_kind(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("nccl")) return kCommunication;
  if (has("me::kernels")) return "engine kernels (engine/kernels)";
  if (has("flash") || has("fmha") || has("sdpa") || has("attention")) return "attention";
  if (has("gemm") || has("cutlass") || has("xmma") || has("nvjet") || has("cublas") || has("wgmma"))
    return "matmul (cuBLAS)";
  if (has("memcpy") || has("memset")) return "memory copies and sets";
  return "other LibTorch kernels";
}

// Kernel names are long templates; drop what every one of them repeats so the part that tells
// kernels apart (the functor, the types) fits the table.
std::string short_name(std::string n) {
  for (const char* noise : {"void ", "at::native::", "(anonymous namespace)::", "c10::", "at::"}) {
    for (size_t at = n.find(noise); at != std::string::npos; at = n.find(noise, at)) n.erase(at, std::strlen(noise));
  }
  return n;
}

struct Span {
  int64_t start, end;
};

// Time covered by at least one span (kernels of several streams overlap).
int64_t covered(std::vector<Span> spans) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  int64_t total = 0, open = 0, close = -1;
  for (const auto& s : spans) {
    if (s.start > close) {
      total += close - open;
      open = s.start;
      close = s.end;
    } else {
      close = std::max(close, s.end);
    }
  }
  return total + (close > open ? close - open : 0);
}

struct Totals {
  int64_t ns = 0, calls = 0;
};

std::string table(const std::string& head, std::vector<std::pair<std::string, Totals>> rows, double per, double base,
                  size_t limit) {
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  char line[512];
  std::snprintf(line, sizeof line, "  %-120s %9s %9s %7s\n", head.c_str(), "ms/step", "calls", "share");
  std::string out = line;
  for (size_t i = 0; i < rows.size() && i < limit; ++i) {
    std::string name = short_name(rows[i].first);
    if (name.size() > 120) name = name.substr(0, 117) + "...";
    const double ms = static_cast<double>(rows[i].second.ns) / 1e6 / per;
    std::snprintf(line, sizeof line, "  %-120s %9.2f %9.0f %6.1f%%\n", name.c_str(), ms,
                  static_cast<double>(rows[i].second.calls) / per, 100.0 * ms / base);
    out += line;
  }
  return out;
}

}  // namespace

StepProfiler::StepProfiler(int64_t at, int64_t steps, std::string trace, bool cuda, int rank)
    : at_(at), steps_(steps), trace_(std::move(trace)), cuda_(cuda) {
  ME_CHECK(at_ >= 0, "train.profile_at must be >= 0 (0: no profile), got ", at_);
  ME_CHECK(steps_ > 0, "train.profile_steps must be a positive integer, got ", steps_);
  if (!trace_.empty() && rank > 0) {
    // trace.json -> trace.rank3.json: every rank writes its own.
    const auto dot = trace_.rfind('.');
    const std::string suffix = cat(".rank", rank);
    trace_ = dot == std::string::npos || dot < trace_.find_last_of('/') + 1 ? trace_ + suffix
                                                                               : trace_.substr(0, dot) + suffix + trace_.substr(dot);
  }
}

StepProfiler::~StepProfiler() {
  if (active_) prof::disableProfiler();
}

void StepProfiler::before_step(int64_t iteration) {
  if (iteration != at_) return;  // at_ = 0: never
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (cuda_) activities.insert(impl::ActivityType::CUDA);
  if (cuda_) compat::cuda_synchronize();  // the profile starts from an idle GPU
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  active_ = true;
  wall_ms_ = 0;
}

std::string StepProfiler::after_step(int64_t iteration, double step_ms) {
  if (!active_) return "";
  wall_ms_ += step_ms;
  if (iteration != at_ + steps_ - 1) return "";
  if (cuda_) compat::cuda_synchronize();  // every kernel of the profiled steps is in
  return summarise();
}

namespace {

// Kernel time per step by kind and by kernel, the GPU's idle share, and the communication no
// other kernel ran beside (exposed).
std::string gpu_summary(const std::vector<prof::KinetoEvent>& events, double per, double step_ms) {
  std::map<std::string, Totals> by_name, by_kind;
  std::vector<Span> spans, compute;  // every kernel; every kernel but NCCL's
  for (const auto& e : events) {
    if (e.deviceType() != c10::DeviceType::CUDA) continue;
    const auto [start, dur] = compat::event_span_ns(e);
    auto& t = by_name[e.name()];
    t.ns += dur;
    t.calls += 1;
    const auto kind = kernel_kind(e.name());
    auto& k = by_kind[kind];
    k.ns += dur;
    k.calls += 1;
    spans.push_back({start, start + dur});
    if (kind != kCommunication) compute.push_back(spans.back());
  }
  char line[256];
  const double busy = static_cast<double>(covered(spans)) / 1e6 / per;
  std::snprintf(line, sizeof line,
                "  step %.1f ms (host); GPU kernels cover %.1f ms (%.1f%%), idle %.1f ms; kernel time by kind:\n",
                step_ms, busy, 100.0 * busy / step_ms, std::max(0.0, step_ms - busy));
  std::string out = line;
  if (by_kind.count(kCommunication)) {
    // What the step waits for: time when NCCL kernels run and nothing else does.
    const double exposed = static_cast<double>(covered(spans) - covered(compute)) / 1e6 / per;
    const double comm = static_cast<double>(by_kind[kCommunication].ns) / 1e6 / per;
    std::snprintf(line, sizeof line, "  communication %.1f ms, of which %.1f ms beside no other kernel (exposed)\n",
                  comm, exposed);
    out += line;
  }
  out += table("kind", {by_kind.begin(), by_kind.end()}, per, step_ms, by_kind.size());
  out += table("heaviest kernels", {by_name.begin(), by_name.end()}, per, step_ms, 25);
  return out;
}

// CPU operators by self time: an op's duration less that of the ops it called (nested inside it).
std::string cpu_summary(const std::vector<prof::KinetoEvent>& events, double per, double step_ms) {
  struct CpuOp {
    uint64_t thread;
    Span span;
    std::string name;
  };
  std::vector<CpuOp> cpu;
  for (const auto& e : events) {
    if (e.deviceType() != c10::DeviceType::CPU) continue;
    const auto [start, dur] = compat::event_span_ns(e);
    cpu.push_back({e.startThreadId(), {start, start + dur}, e.name()});
  }
  std::sort(cpu.begin(), cpu.end(), [](const CpuOp& a, const CpuOp& b) {
    if (a.thread != b.thread) return a.thread < b.thread;
    return a.span.start != b.span.start ? a.span.start < b.span.start : a.span.end > b.span.end;
  });
  std::vector<size_t> stack;  // the ops enclosing the current one, innermost last
  std::vector<int64_t> self(cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (i > 0 && cpu[i].thread != cpu[i - 1].thread) stack.clear();
    while (!stack.empty() && cpu[stack.back()].span.end <= cpu[i].span.start) stack.pop_back();
    self[i] = cpu[i].span.end - cpu[i].span.start;
    if (!stack.empty()) self[stack.back()] -= self[i];
    stack.push_back(i);
  }
  std::map<std::string, Totals> by_name;
  for (size_t i = 0; i < cpu.size(); ++i) {
    auto& t = by_name[cpu[i].name];
    t.ns += self[i];
    t.calls += 1;
  }
  char line[256];
  std::snprintf(line, sizeof line, "  step %.1f ms; CPU operators by self time:\n", step_ms);
  return line + table("operator", {by_name.begin(), by_name.end()}, per, step_ms, 25);
}

}  // namespace

std::string StepProfiler::summarise() {
  auto result = prof::disableProfiler();
  active_ = false;
  std::string written;
  if (!trace_.empty()) {
    try {
      result->save(trace_);
      written = cat("; Chrome trace written to ", trace_);
    } catch (const std::exception& e) {  // Debian's LibTorch has no Kineto: events, but no trace
      const std::string why = e.what();
      written = cat("; no Chrome trace (", why.substr(0, why.find('\n')), ")");
    }
  }
  const double per = static_cast<double>(steps_), step_ms = wall_ms_ / per;
  return cat("profile of iterations ", at_, "..", at_ + steps_ - 1, written, "\n") +
         (cuda_ ? gpu_summary(result->events(), per, step_ms) : cpu_summary(result->events(), per, step_ms));
}

}  // namespace me::train
