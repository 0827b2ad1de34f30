// The layout planner's time model: one training step's time on the busiest GPU, from the
// model's shapes, the layout (a MemoryPlan: the same inputs as the memory estimate) and a
// DeviceProfile of measured speeds. Each term is computed as the engine runs it (the compute
// terms times profile.compute_in_step, kernels in a step being slower than alone):
//   - GEMMs: each linear layer's forward, input-gradient and weight-gradient GEMM at the shapes
//     this tp gives, at the profile's rate for their smallest dimension;
//   - attention: fused causal attention, forward + backward, at the profile's rate for the
//     sequence length;
//   - other kernels: bytes the elementwise kernels (norms, residual adds, activations, rotary,
//     cross entropy) move per token, at the profile's memory bandwidth;
//   - tensor-parallel communication: each layer's all-gathers and reduce-scatters (sequence
//     parallelism) or all-reduces at the link's bus bandwidth, times the profile's measured
//     exposure for that tp size (tp_exposed; tp_exposed_no_sp for the all-reduces);
//   - pipeline: 1F1B's bubble of (pp - 1) micro-batch slots, less the weight-gradient GEMMs held
//     back into it (parallel.pp_deferred_wgrads; not a fully recomputed block's), and the
//     activations sent between stages;
//   - data parallelism: the gradient reduction (and the distributed optimizer's parameter
//     gather) at the link's bandwidth, the part backward does not hide (profile.dp_exposed);
//   - the optimizer step: bytes per parameter at the memory bandwidth;
//   - the host: a micro-batch's pass through a stage takes at least the time the host needs to
//     issue its layers (profile.host_layer_ms by tp; the last stage also its embedding, output
//     layer and loss, profile.host_micro_ms); what it needs beyond the GPU's time is the
//     "host-bound" term, and it sets the pipeline's slot when larger.
// No LibTorch here.
#pragma once
#include <string>

#include "engine/plan/device_profile.h"
#include "engine/plan/memory_estimate.h"

namespace me::plan {

// Milliseconds per step on the busiest GPU, by term; total is their sum.
struct StepTime {
  double gemm = 0, attention = 0, other = 0;  // compute, recomputation included
  double tp_comm = 0;    // exposed tensor-parallel communication
  double pp_comm = 0;    // activations and their gradients sent between stages
  double bubble = 0;     // pipeline fill and drain
  double dp_comm = 0;    // exposed data-parallel gradient (and parameter) traffic
  double optimizer = 0;  // the update, gradient norm and clipping
  double host = 0;       // the host's issue time beyond the GPU's (narrow layers at tp > 1)
  double total = 0;
  int busiest_stage = 0;
  bool tp_crosses_nodes = false, dp_crosses_nodes = false, pp_crosses_nodes = false;
  double tflops_per_gpu = 0;  // model FLOPs (as the progress line counts them) per GPU per second
  double mfu = 0;             // tflops_per_gpu over the profile's matmul_tflops
  double tokens_per_s = 0;    // the whole run's
};

// The step time of `plan` on GPUs described by `profile`, gpus_per_node of them per node (the
// rank order is tp, cp, dp, pp, as comm::RankGrid lays it out: a group crosses nodes when the
// ranks it spans do not fit one node). Throws me::Error for a layout that does not divide.
StepTime estimate_step_time(const MemoryPlan& plan, const DeviceProfile& profile, int gpus_per_node);

// The time of one collective of `bytes` (the whole tensor: the gathered result, the reduced
// input) over `ranks` ranks on `link`, in milliseconds, as nccl-tests' bus bandwidth defines it.
enum class Collective { all_gather, reduce_scatter, all_reduce, send_recv };
double collective_ms(const LinkProfile& link, Collective kind, double bytes, int ranks);

// One GEMM of [m x k] x [k x n] at the profile's rate (ms).
double gemm_ms(const DeviceProfile& profile, double m, double n, double k);

// "GEMMs 52.1 | attention 8.3 | ..." (ms), the terms that are not zero.
std::string describe_terms(const StepTime& t);

}  // namespace me::plan
