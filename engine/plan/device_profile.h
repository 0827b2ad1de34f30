// What the layout planner knows about a GPU and its links: measured speeds, not guessed
// constants. A profile is a JSON file (profiles/*.json, embedded in the binary at build time so
// that a laptop can plan; `megaengine plan --profile FILE` reads another). Every curve is a list
// of [x, value] points measured at those x and interpolated between them in log(x); outside its
// range a curve keeps its end values. No LibTorch here.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace me::plan {

// A measured quantity as a function of a size (bytes, a GEMM dimension, a sequence length).
struct Curve {
  std::vector<std::pair<double, double>> points;  // ascending x, x > 0
  double at(double x) const;                      // interpolated in log(x), clamped at the ends
};

// Collective bus bandwidth (nccl-tests' busbw, GB/s) by message bytes over one kind of link.
struct LinkProfile {
  Curve all_gather, reduce_scatter, all_reduce, send_recv;
  double latency_us = 0;  // added to every collective
};

struct DeviceProfile {
  std::string name;    // "h100-80gb": what --gpu names
  std::string gpu;     // the device name the measurements came from
  std::string source;  // how and where it was measured (or what it was derived from)
  double memory_bytes = 0;   // what one GPU offers the run (the dry run's --gpu-memory)
  double matmul_tflops = 0;  // dense bf16 GEMM, 8192^3 (bench/matmul_peak.lua)
  Curve gemm_efficiency;     // fraction of matmul_tflops by a GEMM's smallest dimension
  double gemm_launch_us = 0; // per GEMM call, added to its FLOP time
  Curve attention_tflops;    // causal fused attention, forward + backward, by sequence length
  double memory_gbps = 0;    // elementwise kernels: bytes read + written per second
  LinkProfile intra_node;    // NVLink (NVSwitch) inside a node
  LinkProfile inter_node;    // EFA / InfiniBand between nodes, per GPU
  // Exposed tensor-parallel communication as a multiple of the collectives' standalone time, by
  // tp size (measured from whole steps: overlap hides part, contention with the GEMMs adds).
  std::map<int, double> tp_exposed;
  // The same for the all-reduces without sequence parallelism (NCCL's, not overlapped like the
  // copy engines' gathers); empty: tp_exposed.
  std::map<int, double> tp_exposed_no_sp;
  // Compute inside a training step over the isolated GEMM, attention and elementwise rates above
  // (a step's kernels run slower than the same kernels timed alone, the more so the wider the
  // layer), by the model's hidden size, fitted from whole steps on one GPU
  // (bench/planner/fit_step_terms.py); empty: 1, where the rates already are in-step ones. The
  // JSON takes a number (every width) or [[hidden, factor], ...].
  Curve compute_in_step;
  double compute_in_step_at(double hidden) const { return compute_in_step.points.empty() ? 1 : compute_in_step.at(hidden); }
  // Fraction of the data-parallel gradient reduction (and the distributed optimizer's parameter
  // gather) that backward does not hide, measured the same way.
  double dp_exposed = 0;

  // Host time to issue one layer's forward and backward for one micro-batch (LibTorch's dispatch,
  // kernel launches, the overlapped collectives' copies and events), ms, by tp size: with
  // sequence parallelism at tp > 1 (host_layer_ms, which also holds tp 1) and without
  // (host_layer_ms_no_sp). Measured on a width whose GPU work is negligible
  // (bench/planner/calibrate_host.sh). Empty: no host term (the step is taken as GPU-bound).
  std::map<int, double> host_layer_ms, host_layer_ms_no_sp;
  // Host time per micro-batch outside the layers (the embedding, the output layer, the loss and
  // their gradients), ms, by tp size (with sequence parallelism at tp > 1), measured the same
  // way. Empty: none.
  std::map<int, double> host_micro_ms;

  // interpolated in log(tp) between the measured sizes; tp_exposed_no_sp's where it has any
  double tp_exposed_at(int tp, bool sequence_parallel = true) const;
  double host_layer_ms_at(int tp, bool sequence_parallel) const;  // 0 without measurements
  double host_micro_ms_at(int tp) const;                          // 0 without measurements
};

// Reads a profile; a clear error (me::Error) naming `what` (the file) and the field that is
// missing or wrong.
DeviceProfile parse_profile(const std::string& json_text, const std::string& what);
DeviceProfile load_profile_file(const std::string& path);
std::string profile_to_json(const DeviceProfile& p);

// The profiles built into the binary (profiles/*.json), by name.
std::vector<std::string> builtin_profile_names();
// A built-in profile by name ("h100-80gb"); a clear error listing the known names otherwise.
DeviceProfile builtin_profile(const std::string& name);
// The profile a command means: the file (--profile) when given, else the built-in `gpu` (--gpu),
// else ME_PLAN_GPU, else h100-80gb.
DeviceProfile select_profile(const std::string& file, const std::string& gpu);

}  // namespace me::plan
