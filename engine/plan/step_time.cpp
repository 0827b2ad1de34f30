#include "engine/plan/step_time.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/core/error.h"

namespace me::plan {

namespace {

// Bytes the elementwise kernels move per token and layer, in units of the activation dtype,
// forward + backward, counted from what the engine's kernels read and write (fused add + norm,
// GeLU in the GEMM epilogue, the SwiGLU and rotary kernels, biases): about 12 passes over the
// hidden size (norms, residual adds, their gradients), the MLP activation (GeLU's epilogue
// gradient: 3 passes of ffn; SwiGLU: 6) and one over the QKV width (rotary, splits). Checked
// against the step profile of GPT 1.3B and LLaMA 1B on one GPU (bench/RESULTS.md, twelfth
// session: ~9 ms of such kernels per step of 8,192 tokens and 24 layers).
constexpr double kHiddenPasses = 12, kGeluFfnPasses = 3, kSwigluFfnPasses = 6, kQkvPasses = 1;
// Of those bytes, the forward pass moves about a third.
constexpr double kForwardShare = 1.0 / 3.0;
// Fused attention's backward does 2.5x its forward's FLOPs (the profile's rate covers both).
constexpr double kAttentionBackward = 2.5;
// The optimizer's bytes per parameter it updates: AdamW reads the fp32 master, two moments and
// the gradient and writes the first three and the bf16 weight (30 B; dev/cuda/adamw measured
// 12.05 ms for 1.1B parameters at 2,738 GB/s); SGD with momentum 18. The gradient norm reads
// each gradient once more.
constexpr double kAdamBytes = 30, kSgdBytes = 18;
// Of a layer's host work (calls issued), the forward's share: backward issues about twice as many
// (input and weight gradients); full recomputation issues the forward again.
constexpr double kForwardHostShare = 1.0 / 3.0;

double ms(double seconds) { return seconds * 1e3; }

}  // namespace

double gemm_ms(const DeviceProfile& p, double m, double n, double k) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  const double flops = 2 * m * n * k;
  const double rate = p.matmul_tflops * 1e12 * p.gemm_efficiency.at(std::min({m, n, k}));
  const double bytes = 2 * (m * k + k * n + m * n);  // bf16 in and out: a thin GEMM is memory-bound
  return ms(std::max(flops / rate, bytes / (p.memory_gbps * 1e9))) + p.gemm_launch_us / 1e3;
}

double collective_ms(const LinkProfile& link, Collective kind, double bytes, int ranks) {
  if (ranks <= 1 || bytes <= 0) return 0;
  const double n = ranks;
  double factor = 1, busbw = 0;
  switch (kind) {
    case Collective::all_gather: factor = (n - 1) / n, busbw = link.all_gather.at(bytes); break;
    case Collective::reduce_scatter: factor = (n - 1) / n, busbw = link.reduce_scatter.at(bytes); break;
    case Collective::all_reduce: factor = 2 * (n - 1) / n, busbw = link.all_reduce.at(bytes); break;
    case Collective::send_recv: factor = 1, busbw = link.send_recv.at(bytes); break;
  }
  return ms(bytes * factor / (busbw * 1e9)) + link.latency_us / 1e3;
}

namespace {

// One tensor-parallel exchange of a [tokens x hidden] activation of `bytes`: an all-gather and a
// reduce-scatter under sequence parallelism, else an all-reduce (ms, standalone).
double tp_exchange_ms(const LinkProfile& link, bool sequence_parallel, double bytes, int tp) {
  if (tp <= 1) return 0;
  return sequence_parallel ? collective_ms(link, Collective::all_gather, bytes, tp) +
                                 collective_ms(link, Collective::reduce_scatter, bytes, tp)
                           : collective_ms(link, Collective::all_reduce, bytes, tp);
}

// One micro-batch through one layer on one GPU, ms, by term.
struct LayerTime {
  double gemm = 0, attention = 0, other = 0, tp = 0;
  double wgrad = 0;  // of gemm: the weight-gradient GEMMs (what deferred wgrads move into the bubble)
  double total() const { return gemm + attention + other + tp; }
};

LayerTime layer_time(const MemoryPlan& plan, const DeviceProfile& p, const LinkProfile& tp_link) {
  const auto& c = plan.model;
  const int tp = plan.tp;
  const double T = static_cast<double>(plan.micro_batch * c.seq), s = static_cast<double>(c.seq);
  const double h = static_cast<double>(c.hidden), f = static_cast<double>(c.ffn()), d = static_cast<double>(c.head_dim());
  const double q = static_cast<double>(c.heads) * d, kv = static_cast<double>(c.groups()) * d;
  const bool gated = c.activation == "swiglu";
  const double dtype = plan.precision == "fp32" ? 4 : 2;

  // The four linear layers: {output features, input features} on this tp rank.
  const double linears[4][2] = {{(q + 2 * kv) / tp, h}, {h, q / tp}, {(gated ? 2 : 1) * f / tp, h}, {h, f / tp}};
  double forward = 0, dgrad = 0, wgrad = 0;
  for (const auto& l : linears) {
    forward += gemm_ms(p, T, l[0], l[1]);
    dgrad += gemm_ms(p, T, l[1], l[0]);
    wgrad += gemm_ms(p, l[0], l[1], T);
  }
  // Causal attention: each query attends to s / 2 keys on average; QK^T and PV, 2 FLOPs each.
  const double attention_fwd_flops = 2 * 2 * T * (s / 2) * (static_cast<double>(c.heads) / tp) * d;
  const double attention = ms(attention_fwd_flops * (1 + kAttentionBackward) / (p.attention_tflops.at(s) * 1e12));
  const double attention_fwd = attention / (1 + kAttentionBackward);

  const double h_local = plan.sequence_parallel ? h / tp : h;  // norms and adds over split tokens
  const double per_token = dtype * (kHiddenPasses * h_local + (gated ? kSwigluFfnPasses : kGeluFfnPasses) * f / tp +
                                    kQkvPasses * (q + 2 * kv) / tp);
  const double other = ms(T * per_token / (p.memory_gbps * 1e9));

  LayerTime t;
  t.gemm = forward + dgrad + wgrad;
  t.wgrad = wgrad;
  t.attention = attention;
  t.other = other;
  // Tensor parallelism: forward and backward each gather and scatter twice (sequence
  // parallelism) or all-reduce twice, over the whole [tokens x hidden] activation.
  const double tp_fwd = 2 * tp_exchange_ms(tp_link, plan.sequence_parallel, T * h * dtype, tp);
  const double exposed = p.tp_exposed_at(tp, plan.sequence_parallel);
  t.tp = 2 * tp_fwd * exposed;
  // Recomputation runs (part of) the forward again inside backward.
  if (c.recompute == "full") {
    const double share = 1.0 / static_cast<double>(std::max<int64_t>(1, c.recompute_every));
    t.gemm += share * forward;
    t.attention += share * attention_fwd;
    t.other += share * other * kForwardShare;
    t.tp += share * tp_fwd * exposed;
    t.wgrad *= 1 - share;  // a recomputed block's weight gradients are never held back (WeightGradsInline)
  } else if (c.recompute == "selective") {
    t.attention += attention_fwd;
  }
  // Kernels inside a step run slower than timed alone (profile.compute_in_step).
  const double k = p.compute_in_step_at(h);
  t.gemm *= k, t.wgrad *= k, t.attention *= k, t.other *= k;
  return t;
}

// The gradient reduction over dp (what backward does not hide) and the optimizer step, for this
// GPU's parameters: the busiest stage's share on one tp rank.
void add_update_terms(const MemoryPlan& plan, const DeviceProfile& p, StepTime& st) {
  const int tp = plan.tp, pp = plan.pp, dp = plan.dp();
  const auto split = plan.stage_split();
  const model::PipelineStage stage{st.busiest_stage, pp, split.first, split.second};
  const double params = static_cast<double>(stage_parameters(plan.model, tp, stage, true));
  const double grad_bytes = plan.grad_reduce_dtype == "bf16" ? 2 : 4;
  const double dtype = plan.precision == "fp32" ? 4 : 2;
  if (dp > 1) {
    const auto& link = st.dp_crosses_nodes ? p.inter_node : p.intra_node;
    const double grads = params * grad_bytes;
    const double traffic = plan.distributed_optimizer
                               ? collective_ms(link, Collective::reduce_scatter, grads, dp) +
                                     collective_ms(link, Collective::all_gather, params * dtype, dp)
                               : collective_ms(link, Collective::all_reduce, grads, dp);
    st.dp_comm = traffic * p.dp_exposed;
  }
  const double updated = plan.distributed_optimizer ? params / dp : params;
  st.optimizer = ms((updated * (plan.optimizer == "sgd" ? kSgdBytes : kAdamBytes) + params * grad_bytes) /
                    (p.memory_gbps * 1e9));
}

}  // namespace

StepTime estimate_step_time(const MemoryPlan& plan, const DeviceProfile& p, int gpus_per_node) {
  plan.validate();
  ME_CHECK(gpus_per_node >= 1, "gpus per node must be positive, got ", gpus_per_node);
  const auto& c = plan.model;
  const int tp = plan.tp, pp = plan.pp, dp = plan.dp();
  const double dtype = plan.precision == "fp32" ? 4 : 2;
  const double T = static_cast<double>(plan.micro_batch * c.seq), h = static_cast<double>(c.hidden);

  StepTime st;
  st.tp_crosses_nodes = tp > gpus_per_node;
  st.dp_crosses_nodes = dp > 1 && tp * dp > gpus_per_node;
  st.pp_crosses_nodes = pp > 1 && plan.world > gpus_per_node;
  const auto& tp_link = st.tp_crosses_nodes ? p.inter_node : p.intra_node;
  const LayerTime layer = layer_time(plan, p, tp_link);

  // Each stage's micro-batch: its layers, plus the embedding (first) and the output layer and
  // loss (last). The busiest stage sets the pipeline's pace.
  const auto split = plan.stage_split();
  const model::PipelineStage shape{0, pp, split.first, split.second};
  const auto layers = shape.stage_layers(c.layers);
  const double V = static_cast<double>(c.padded_vocab(tp));
  const double k = p.compute_in_step_at(h);
  const double output_gemm = k * (gemm_ms(p, T, V / tp, h) + gemm_ms(p, T, h, V / tp) + gemm_ms(p, V / tp, h, T));
  const double loss_other = k * ms(T * (V / tp) * dtype * 4 / (p.memory_gbps * 1e9));  // logits, softmax, in-place gradient
  const double output_tp = tp_exchange_ms(tp_link, plan.sequence_parallel, T * h * dtype, tp) * p.tp_exposed_at(tp, plan.sequence_parallel);
  const double embedding_other = k * ms(T * h * dtype * 3 / (p.memory_gbps * 1e9));
  // The host's time to issue one layer for one micro-batch; a stage's slot is the longer of it
  // (times the stage's layers, and on the last stage the embedding, output layer and loss's
  // host_micro_ms, which the calibration measures together) and the GPU's.
  double host_layer = p.host_layer_ms_at(tp, plan.sequence_parallel);
  const double host_micro = p.host_micro_ms_at(tp);
  if (c.recompute == "full")
    host_layer *= 1 + kForwardHostShare / static_cast<double>(std::max<int64_t>(1, c.recompute_every));
  double busiest = -1, host_slot = 0;
  LayerTime stage_terms;
  for (int s = 0; s < pp; ++s) {
    const double L = static_cast<double>(layers[static_cast<size_t>(s)]);
    LayerTime t{L * layer.gemm, L * layer.attention, L * layer.other, L * layer.tp, L * layer.wgrad};
    if (s == 0) t.other += embedding_other;
    if (s == pp - 1) t.gemm += output_gemm, t.other += loss_other, t.tp += output_tp;
    const double host = L * host_layer + (s == pp - 1 ? host_micro : 0);
    const double slot = std::max(t.total(), host);
    if (slot > busiest) busiest = slot, stage_terms = t, st.busiest_stage = s, host_slot = host;
  }
  const double gpu_slot = stage_terms.total();

  const double m = static_cast<double>(plan.micro_batches());
  st.gemm = m * stage_terms.gemm;
  st.attention = m * stage_terms.attention;
  st.other = m * stage_terms.other;
  st.tp_comm = m * stage_terms.tp;
  st.host = m * std::max(0.0, host_slot - gpu_slot);
  if (pp > 1) {
    // 1F1B: pp - 1 micro-batch slots of fill and drain; held-back weight-gradient GEMMs run in them
    // (the GPU's part of the slot; the host still issues them).
    const bool deferred = plan.deferred_wgrads > 0 && plan.grad_accumulation_fusion;
    st.bubble = (pp - 1) * std::max(host_slot, gpu_slot - (deferred ? stage_terms.wgrad : 0));
    const double act = T * h * dtype / (plan.sequence_parallel ? tp : 1);
    const auto& link = st.pp_crosses_nodes ? p.inter_node : p.intra_node;
    st.pp_comm = m * 2 * collective_ms(link, Collective::send_recv, act, 2);  // activations forward, gradients back
  }

  add_update_terms(plan, p, st);

  st.total = st.gemm + st.attention + st.other + st.tp_comm + st.host + st.pp_comm + st.bubble + st.dp_comm + st.optimizer;
  const double tokens = static_cast<double>(plan.global() * c.seq);
  st.tokens_per_s = tokens / (st.total / 1e3);
  st.tflops_per_gpu = c.flops_per_token(tp) * st.tokens_per_s / plan.world / 1e12;
  st.mfu = st.tflops_per_gpu / p.matmul_tflops;
  return st;
}

std::string describe_terms(const StepTime& t) {
  std::string out;
  auto add = [&](const char* name, double v) {
    if (v <= 0.005) return;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.1f", out.empty() ? "" : " | ", name, v);
    out += buf;
  };
  add("GEMMs", t.gemm);
  add("attention", t.attention);
  add("other kernels", t.other);
  add("TP comm exposed", t.tp_comm);
  add("host-bound", t.host);
  add("PP sends", t.pp_comm);
  add("PP bubble", t.bubble);
  add("DP comm exposed", t.dp_comm);
  add("optimizer", t.optimizer);
  return out + " (ms)";
}

}  // namespace me::plan
