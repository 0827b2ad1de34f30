// The memory estimate's terms, each from what this engine's code actually keeps.
//
// Notation (per GPU): s = model.seq, b = micro batch, T = s x b tokens, h = hidden, a = heads,
// g = key/value groups, d = h / a, f = the MLP width, V = the padded vocabulary, t = tp, and
// r = the rows of the residual stream: T, or T / t under sequence parallelism.
//
// Activations per layer. Korthikanti et al. 2022 count, in bytes at 16 bits, sbh x (34 + 5as/h)
// without tensor parallelism, sbh x (10 + 24/t + 5as/(ht)) with it, and sbh x (34/t + 5as/(ht))
// with sequence parallelism. This engine keeps, in elements of the activation dtype:
//   2 r h        the two norms' inputs (AddNormFn saves the residual sum it normalises)
//   2 T h        the inputs of the QKV and first MLP GEMMs (the norms' outputs). Departure: under
//                sequence parallelism LinearMainGrad saves the all-gathered input, T h, where
//                Megatron saves its own T/t chunk and gathers again in backward (the paper's 34/t)
//   T (a+2g) d/t the fused QKV output: SDPA saves q, k, v as views of it (v alone with RoPE or
//   + T (a+g) d/t    GQA, where q and k are new tensors, rotated or split)
//   T a d/t      the attention output, which is the output projection's saved input
//   2 T f/t      GeLU MLP: the first GEMM's output and its GeLU (the paper's 16 sbh at f = 4h)
//   3 T f/t      SwiGLU: the gate/up output (2f) and silu(gate) x up (f), where the paper has GeLU
// plus fp32 row statistics of the two norms and the attention's logsumexp (4 T a/t bytes).
// Departures, all from the code: no dropout (the paper's masks, 2 sbh + 5as^2b of them), and no
// attention scores: SDPA's flash / memory-efficient kernels on the GPU keep none (the paper's
// 5as^2b/t); with fused_attention = false (LibTorch's composition) the softmax output, b a s^2 / t
// elements, is kept. Selective recomputation (Recompute3 over the attention core) therefore saves
// only the logsumexp on the GPU; full recomputation keeps r h per layer (the block's input).
// fp32 training keeps every one of these in 4 bytes (the paper assumes 2).
//
// Around them: 1F1B keeps min(pp - stage, micro-batches) micro-batches in flight on a stage
// (the first stage the most), plus pp_deferred_wgrads - 1 held-back ones; the peak is at the start
// of a backward, with the larger of two transients on top: the last stage's logits and output
// layer, or one layer's backward working set (with a rebuilt layer under recomputation).
// The constants (memory_estimate.h):
//   kWorkspaceBytes 64 MiB: LibTorch allocates its cuBLAS workspaces (32 MiB each on Hopper, one
//     per stream that runs GEMMs) through the caching allocator; with the step's token ids it is
//     what the H100/H200 peaks in bench/RESULTS.md hold beyond the other terms (36,038 MiB measured
//     for GPT 1.3B against 35,969 MiB of terms, 30,570 against 30,503 for LLaMA 1B).
//   kCudaContextBytes 1 GiB: the CUDA context and the kernel images of LibTorch, cuBLAS and cuDNN
//     (nvidia-smi shows about 0.5-0.8 GiB per process before any tensor), and this engine's
//     cuBLASLt workspaces (32 MiB per stream, cudaMalloc'ed): none of it is in the allocator.
//   kNcclGroupBytes 256 MiB per communicator of more than one rank: NCCL's own buffers (4 MiB per
//     protocol and channel and peer by default), outside the allocator; a rough, safe figure.
//   kFragmentation 5%: what the caching allocator reserves beyond what tensors hold at the peak.
#include "engine/plan/memory_estimate.h"

#include <algorithm>
#include <tuple>

#include "engine/core/error.h"

namespace me::plan {
namespace {

struct Dims {
  double T, r, h, a, g, d, f, V, t, s, b;
  double act_bytes, param_bytes;
};

Dims dims(const MemoryPlan& p) {
  const auto& c = p.model;
  Dims x{};
  x.s = static_cast<double>(c.seq);
  x.b = static_cast<double>(p.micro_batch);
  x.T = x.s * x.b;
  x.t = static_cast<double>(p.tp);
  x.r = p.sequence_parallel && p.tp > 1 ? x.T / x.t : x.T;
  x.h = static_cast<double>(c.hidden);
  x.a = static_cast<double>(c.heads);
  x.g = static_cast<double>(c.groups());
  x.d = static_cast<double>(c.head_dim());
  x.f = static_cast<double>(c.ffn());
  x.V = static_cast<double>(c.padded_vocab(p.tp));
  x.act_bytes = x.param_bytes = p.precision == "fp32" ? 4.0 : 2.0;
  return x;
}

bool swiglu(const model::TransformerConfig& c) { return c.activation == "swiglu"; }
double norm_stat_bytes(const model::TransformerConfig& c) { return c.norm == "layernorm" ? 8.0 : 4.0; }  // mean + rstd

int64_t layer_parameters(const model::TransformerConfig& c, int64_t tp, bool per_rank) {
  const int64_t t = per_rank ? tp : 1, h = c.hidden, d = c.head_dim(), f = c.ffn(), b = c.bias ? 1 : 0;
  const int64_t qkv = (c.heads + 2 * c.groups()) * d / t, q = c.heads * d / t;
  const int64_t norms = 2 * (c.norm == "layernorm" ? 2 * h : h);
  const int64_t attention = h * qkv + b * qkv + q * h + b * h;
  const int64_t mlp = swiglu(c) ? h * 2 * f / t + b * 2 * f / t + f / t * h + b * h : h * f / t + b * f / t + f / t * h + b * h;
  return norms + attention + mlp;
}

// The weights of one layer's four linear layers on a tp rank: what precision = "fp8" keeps cast
// (E4M3, and its transposed copy: 2 bytes per weight) from one optimizer step to the next.
int64_t layer_linear_weights(const model::TransformerConfig& c, int64_t tp) {
  const int64_t h = c.hidden, d = c.head_dim(), f = c.ffn();
  const int64_t qkv = (c.heads + 2 * c.groups()) * d / tp, q = c.heads * d / tp;
  return h * qkv + q * h + (swiglu(c) ? 3 : 2) * h * f / tp;
}

// Bytes one layer's backward holds beyond the saved activations (elements as in the header
// comment): the residual gradient and the norm's input gradient (2 r h), a column-parallel
// layer's input gradient before its TP reduction (T h; under sequence parallelism also the
// all-gathered output gradient a row-parallel layer keeps for its weight gradient, T h), and the
// larger of the MLP's (GeLU: d pre, T f/t; SwiGLU: d of its output and of gate/up, 3 T f/t) and
// attention's (dq, dk, dv and the fused QKV gradient, 2 T (a+2g) d/t) own gradients.
double layer_backward_bytes(const MemoryPlan& p, const Dims& x) {
  const double tp_grads = x.T * x.h * (p.sequence_parallel && p.tp > 1 ? 2.0 : 1.0);
  const double mlp = x.T * x.f / x.t * (swiglu(p.model) ? 3.0 : 1.0);
  const double attention = 2.0 * x.T * (x.a + 2 * x.g) * x.d / x.t;
  return (2.0 * x.r * x.h + tp_grads + std::max(mlp, attention)) * x.act_bytes;
}

}  // namespace

std::pair<int64_t, int64_t> MemoryPlan::stage_split() const {
  if (pp > 1 && pp_split == "balanced" && pp_first_layers == 0 && pp_last_layers == 0)
    return model::balanced_stage_split(model, pp, tp);
  return {pp_first_layers, pp_last_layers};
}

void MemoryPlan::validate() const {
  ME_CHECK(world >= 1 && tp >= 1 && pp >= 1, "world, parallel.tp and parallel.pp must be positive integers");
  ME_CHECK(world % (tp * pp) == 0, "world size ", world, " is not divisible by tp*pp = ", tp * pp, " (tp=", tp,
           ", pp=", pp, "): choose a tp and pp whose product divides the number of GPUs");
  ME_CHECK(micro_batch > 0, "batch.micro must be a positive integer, got ", micro_batch);
  model.validate("model", tp, sequence_parallel);
  const auto [first, last] = stage_split();
  model::PipelineStage{0, pp, first, last}.stage_layers(model.layers);
  ME_CHECK(global() % (micro_batch * dp()) == 0, "batch.global (", global(),
           ") is not divisible by batch.micro x data-parallel size (", micro_batch, " x ", dp(), " = ",
           micro_batch * dp(), "): choose a global batch that is a multiple of it");
  ME_CHECK(precision == "fp32" || precision == "bf16" || precision == "fp16" || precision == "fp8",
           "precision must be fp32, bf16, fp16 or fp8, got '", precision, "'");
  ME_CHECK(grad_reduce_dtype == "fp32" || grad_reduce_dtype == "bf16",
           "parallel.grad_reduce_dtype must be fp32 or bf16, got '", grad_reduce_dtype, "'");
}

double StageMemory::allocator_peak(bool distributed) const {
  return weights + gradients - symmetric + optimizer(distributed) + activations + transient() + workspace;
}

double StageMemory::total(bool distributed) const {
  const double peak = allocator_peak(distributed);
  return peak * (1.0 + kFragmentation) + outside;
}

const StageMemory& MemoryEstimate::worst() const {
  const StageMemory* w = &stages.front();
  for (const auto& s : stages)
    if (s.total(plan.distributed_optimizer) > w->total(plan.distributed_optimizer)) w = &s;
  return *w;
}

int64_t stage_parameters(const model::TransformerConfig& c, int tp, const model::PipelineStage& stage, bool per_rank) {
  const auto [first_layer, layers] = stage.layer_range(c.layers);
  (void)first_layer;
  const int64_t h = c.hidden, vocab_rows = c.padded_vocab(tp) / (per_rank ? tp : 1);
  int64_t n = layers * layer_parameters(c, tp, per_rank);
  if (stage.first()) {
    n += vocab_rows * h;
    if (c.position == "learned") n += c.seq * h;
  }
  if (stage.last()) {
    n += c.norm == "layernorm" ? 2 * h : h;
    // An untied output layer; or, tied over several stages, the last stage's own embedding copy.
    if (!c.tie_embeddings || !stage.first()) n += vocab_rows * h;
  }
  return n;
}

double layer_activation_bytes(const MemoryPlan& p, bool recomputed) {
  const Dims x = dims(p);
  if (recomputed && p.model.recompute == "full") return x.r * x.h * x.act_bytes;  // the block's input
  const auto& c = p.model;
  const bool selective = recomputed && c.recompute == "selective";
  const bool split_qk = c.position == "rope" || c.groups() != c.heads;  // q and k are new tensors
  double elems = 2 * x.r * x.h + 2 * x.T * x.h + x.T * (x.a + 2 * x.g) * x.d / x.t +
                 (split_qk ? x.T * (x.a + x.g) * x.d / x.t : 0.0) + x.T * x.a * x.d / x.t +
                 x.T * x.f / x.t * (swiglu(c) ? 3.0 : 2.0);
  if (!p.fused_attention && !selective) {
    elems += x.b * x.a / x.t * x.s * x.s;  // the softmax output the composed attention keeps
    if (c.groups() != c.heads) elems += 2 * x.T * x.a * x.d / x.t;  // k and v repeated for each query head
  }
  double bytes = elems * x.act_bytes + 2 * x.r * norm_stat_bytes(c);
  if (p.fused_attention && !selective) bytes += 4.0 * x.T * x.a / x.t;  // fp32 logsumexp
  // fp8: each linear layer keeps its input as E4M3 x^T (1 byte) instead of x: the QKV and fc1
  // inputs and the MLP's second input lose a byte each; the attention output, which attention
  // keeps in bf16 anyway, gains its fp8 copy.
  if (p.precision == "fp8") bytes += x.T * x.a * x.d / x.t - 2 * x.T * x.h - x.T * x.f / x.t;
  return bytes;
}

namespace {

// Whether layer i (counted in the whole model) runs under the plan's recomputation.
bool recomputed_layer(const model::TransformerConfig& c, int64_t i) {
  return c.recompute == "selective" || (c.recompute == "full" && i % std::max<int64_t>(1, c.recompute_every) == 0);
}

// Activations of one micro-batch on a stage: its layers (full recomputation applies to every
// recompute_every-th layer, counted in the whole model) and the stage's own tensors: a non-last
// stage keeps the output it sent (the pipeline calls backward on it), the last stage the final
// norm's input and statistics and the output layer's input (gathered under sequence parallelism).
double stage_activation_bytes(const MemoryPlan& p, const Dims& x, int64_t first_layer, int64_t layers, bool last) {
  const auto& c = p.model;
  double bytes = 0;
  for (int64_t i = first_layer; i < first_layer + layers; ++i) bytes += layer_activation_bytes(p, recomputed_layer(c, i));
  if (!last) return bytes + x.r * x.h * x.act_bytes;
  return bytes + (x.r + x.T) * x.h * x.act_bytes + x.r * norm_stat_bytes(c);
}

// The tied word embedding's gradient that autograd holds on the last stage until the backward is
// over: only without gradient-accumulation fusion (with it, the output layer's GEMM and the
// lookup's backward both write into the main grad).
double held_tied_embedding_grad_bytes(const MemoryPlan& p, const Dims& x) {
  return p.model.tie_embeddings && !p.grad_accumulation_fusion ? x.V / x.t * x.h * x.param_bytes : 0.0;
}

// The last stage at its output layer's backward: the logits [T, V/t] (the fused cross entropy
// keeps them and turns them into their gradient in place; LibTorch's composition keeps an fp32
// softmax, then makes an fp32 gradient and its cast), fp32 row statistics, the output layer's
// input gradient (T h) and the tied embedding's gradient autograd may hold.
double logits_bytes(const MemoryPlan& p, const Dims& x) {
  const double logits = x.T * x.V / x.t;
  double bytes = p.fused_kernels ? logits * x.act_bytes : logits * (4.0 + 4.0 + x.act_bytes);
  bytes += 6 * 4.0 * x.T + x.T * x.h * x.act_bytes;
  bytes += held_tied_embedding_grad_bytes(p, x);
  return bytes;
}

// The heaviest point of a layer's backward: its working set; with recomputation, the activations
// it rebuilds first (under full, a whole layer's less the input it kept, counted already; by
// then the layers after it in the stage have freed theirs; under selective, the attention
// output); and on a last stage the tied embedding's gradient autograd may hold.
double backward_peak_bytes(const MemoryPlan& p, const Dims& x, int64_t first_layer, int64_t layers, bool last) {
  const auto& c = p.model;
  double bytes = layer_backward_bytes(p, x);
  if (c.recompute == "full") {
    double rebuilt = 0, freed = 0;  // at the last recomputed layer of the stage, the first rebuilt
    for (int64_t i = first_layer + layers - 1; i >= first_layer; --i) {
      if (recomputed_layer(c, i)) {
        rebuilt = layer_activation_bytes(p, false) - x.r * x.h * x.act_bytes;
        break;
      }
      freed += layer_activation_bytes(p, false);
    }
    bytes += std::max(0.0, rebuilt - freed);
  }
  if (c.recompute == "selective") bytes += x.T * x.a * x.d / x.t * x.act_bytes + 4.0 * x.T * x.a / x.t;
  if (last) bytes += held_tied_embedding_grad_bytes(p, x);
  return bytes;
}

// Memory outside LibTorch's allocator: the CUDA context, NCCL's buffers for each process group
// of more than one rank (tp, dp, pp, the model-parallel and embedding groups), and the buffers
// parallel.symmetric_buffers and tp_symmetric_mb allocate through NCCL, tp_comm_backend =
// "copy_engine" with cudaMalloc.
double outside_allocator(const MemoryPlan& p, const StageMemory& m) {
  int groups = 0;
  const int dp = p.dp();
  groups += p.tp > 1;
  groups += dp > 1;
  groups += p.pp > 1 ? 2 : 0;  // pipeline and embedding groups
  groups += p.tp * p.pp > 1;   // model-parallel (gradient norm)
  // copy_engine: two slots of one [tokens, hidden] activation (kernels/peer_buffers.h)
  const double peer = p.tp_copy_engine && p.tp > 1
                          ? 2.0 * static_cast<double>(p.micro_batch * p.model.seq * p.model.hidden) * (p.precision == "fp32" ? 4 : 2)
                          : 0.0;
  return kCudaContextBytes + groups * kNcclGroupBytes + p.tp_symmetric_mb * 1048576 + peer + m.symmetric;
}

// The parameter and gradient buffers parallel.symmetric_buffers allocates through NCCL instead.
double symmetric_bytes(const MemoryPlan& p, const StageMemory& m) {
  if (p.symmetric_buffers == "none" || p.dp() == 1) return 0;
  return (p.distributed_optimizer ? m.weights : 0.0) + (p.symmetric_buffers == "all" ? m.gradients : 0.0);
}

}  // namespace

MemoryEstimate estimate_memory(const MemoryPlan& plan) {
  plan.validate();
  MemoryEstimate e;
  e.plan = plan;
  const Dims x = dims(plan);
  const auto [first_layers, last_layers] = plan.stage_split();
  const int64_t m = plan.micro_batches();
  const double grad_bytes = plan.grad_reduce_dtype == "bf16" ? 2.0 : 4.0;
  const double moment_bytes = plan.optimizer == "sgd" ? 4.0 : 8.0;
  const double master_bytes = x.param_bytes == 4.0 ? 0.0 : 4.0;  // fp32 training: the weights are the masters
  for (int s = 0; s < plan.pp; ++s) {
    const model::PipelineStage stage{s, plan.pp, first_layers, last_layers};
    StageMemory st;
    st.stage = s;
    std::tie(st.first_layer, st.layers) = stage.layer_range(plan.model.layers);
    st.parameters = stage_parameters(plan.model, plan.tp, stage, /*per_rank=*/true);
    const double n = static_cast<double>(st.parameters);
    st.weights = n * x.param_bytes;
    if (plan.precision == "fp8") st.weights += 2.0 * static_cast<double>(st.layers * layer_linear_weights(plan.model, plan.tp));
    st.gradients = n * grad_bytes;
    st.optimizer_replicated = n * (moment_bytes + master_bytes);
    st.dp = plan.dp();
    st.optimizer_sharded = st.optimizer_replicated / plan.dp();
    // 1F1B: stage s runs pp - s - 1 warm-up forwards before its first backward. Weight gradients
    // held back past a backward (pp_deferred_wgrads - 1 micro-batches) keep their GEMMs' inputs
    // and output gradients, about as much as the micro-batch's activations.
    int64_t alive = std::min<int64_t>(plan.pp - s, m);
    if (plan.pp > 1 && plan.grad_accumulation_fusion && plan.deferred_wgrads > 1)
      alive = std::min<int64_t>(m, alive + plan.deferred_wgrads - 1);
    st.in_flight = alive;
    st.activations_per_micro = stage_activation_bytes(plan, x, st.first_layer, st.layers, stage.last());
    st.activations = static_cast<double>(alive) * st.activations_per_micro;
    if (stage.last()) st.logits_peak = logits_bytes(plan, x);
    st.layer_peak = backward_peak_bytes(plan, x, st.first_layer, st.layers, stage.last());
    // The step's tokens and labels (int64, every stage holds both) and the cuBLAS workspaces.
    st.workspace = kWorkspaceBytes + 2.0 * 8.0 * static_cast<double>(m) * x.T;
    st.symmetric = symmetric_bytes(plan, st);
    st.outside = outside_allocator(plan, st);
    e.stages.push_back(st);
  }
  return e;
}

}  // namespace me::plan
