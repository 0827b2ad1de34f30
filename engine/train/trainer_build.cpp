// A Trainer is built in named steps (trainer.h says their order): each takes one part of the
// recipe and makes one part of the run, and the first lines of the log describe the result.
#include "engine/train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/core/determinism.h"
#include "engine/core/format.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/core/exit_status.h"
#include "engine/core/stop_signals.h"
#include "engine/core/torch_compat.h"
#include "engine/core/build_config.h"  // ME_HAVE_CUDA_KERNELS
#include "engine/kernels/fused_ops.h"
#include "engine/model/block_graphs.h"
#if ME_HAVE_CUDA_KERNELS
#include "engine/kernels/peer_buffers.h"
#endif
#include "engine/checkpoint/metadata.h"
#include "engine/plan/memory_report.h"
#include "engine/train/run_metrics.h"
#include "engine/train/step_profiler.h"

namespace me::train {

namespace {

torch::Device parse_device(const std::string& name) {
  if (name == "cpu") return torch::kCPU;
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    ME_CHECK(compat::cuda_available(), "device '", name,
             "' asked for, but this LibTorch build sees no CUDA GPU: use device=cpu");
    return torch::Device(name);
  }
  fail("unknown device '", name, "': expected cpu, cuda or cuda:N");
}

torch::ScalarType param_dtype(const std::string& precision) {
  return precision == "bf16" || precision == "fp8" ? torch::kBFloat16 : precision == "fp16" ? torch::kHalf : torch::kFloat;
}

}  // namespace

// ---- construction, in named steps ------------------------------------------------------

Trainer::Trainer(config::Recipe spec)
    : spec_(std::move(spec)),
      device_(parse_device(spec_.device)),
      phases_(spec_.train.profile_phases, device_.is_cuda()) {
  validate(spec_);
  // Before anything reaches cuBLAS or NCCL, which read their settings when first used.
  if (spec_.train.deterministic) deterministic_settings_ = apply_deterministic_mode();
  if (spec_.precision == "fp16") scaler_ = std::make_unique<optim::LossScaler>();
  connect();
  host_lead_ = std::make_unique<HostLead>(device_.is_cuda() && comm_ && comm_->world_size() > 1);
  check_output_dirs();
  plan_batches();
  find_checkpoint();
  open_data();
  build_model();
  build_optimizer();
  build_pipeline();
  build_block_graphs();
  resume();
  if (saver_) saver_->prepare(state_tensors());  // the first save's host buffers, allocated meanwhile
}

Trainer::~Trainer() {
  // The graphs report to this trainer's gradient buffer: a model kept after it runs eagerly.
  if (model_) model_->set_block_graphs(nullptr);
}

// Several ranks (a launcher set RANK/WORLD_SIZE or Slurm did): a communicator and the tp, pp
// and dp groups; dp is what tp x pp leaves of the world.
void Trainer::connect() {
  const auto& par = spec_.parallel;
  const auto env = launch::read_launch_env();
  if (env.world == 1 && par.tp == 1 && par.pp == 1) return;
  comm::CommOptions options = spec_.comm;
  options.device = spec_.device;
  comm_ = std::make_unique<comm::Communicator>(env, options);
  if (comm_->cuda_device() >= 0)
    device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(comm_->cuda_device()));
  groups_ = std::make_unique<comm::ParallelGroups>(
      comm::make_parallel_groups(*comm_, static_cast<int>(par.tp), static_cast<int>(par.pp)));
  for (const auto& w : groups_->warnings) log::warn(w);
  if (comm_->rank() == 0) log::info(groups_->layout_table);
  plan_.dp = groups_->dp->size();
  plan_.dp_rank = groups_->dp->rank();
}

// global batch = micro batch x data-parallel size x accumulation steps
void Trainer::plan_batches() {
  const auto p = config::plan_steps(spec_, plan_.dp);  // the dry run's plan too
  plan_.global = p.global;
  plan_.accumulation = p.accumulation;
  plan_.iters = p.iters;
  lr_schedule_ = spec_.schedule.resolve(spec_.optim.lr, plan_.iters, plan_.global);
}

void Trainer::open_data() {
  DataLayout layout;
  layout.global_batch = plan_.global;
  layout.micro = spec_.batch.micro;
  layout.dp = plan_.dp;
  layout.dp_rank = plan_.dp_rank;
  layout.accumulation = plan_.accumulation;
  layout.iters = plan_.iters;
  layout.consumed_samples = resume_consumed_;
  layout.pin_memory = device_.is_cuda();
  data_ = std::make_unique<TrainData>(spec_, comm_.get(), layout);
  ME_CHECK(spec_.model.vocab >= data_->vocab(), "model.vocab (", spec_.model.vocab, ") is smaller than the ",
           data_->vocab(), " ids of the data's tokenizer: set model.vocab = ", data_->vocab());
}

#if ME_HAVE_CUDA_KERNELS
namespace {
// Whether every rank of `group` says ok (a min all-reduce), so that all of them go on to the next
// collective or none does.
bool all_ok(comm::ProcessGroup& group, bool ok, const torch::Device& device) {
  auto flag = torch::full({1}, ok ? 1 : 0, torch::TensorOptions(torch::kInt).device(device));
  group.all_reduce(flag, comm::ReduceOp::min);
  return flag.item<int>() == 1;
}
}  // namespace
#endif

// The copy-engine backend (parallel.tp_backend()): this rank's peer buffers, mapped by every
// rank of its tensor-parallel group (their CUDA IPC handles all-gathered over the group). A slot
// holds the largest TP collective, a [micro x seq, hidden] activation. The ranks agree at each
// step, so that a rank that cannot allocate or map them fails the group, never hangs it; under
// tp_comm_backend = "auto" the group then uses NCCL.
void Trainer::open_tp_peers() {
  const bool may_fall_back = spec_.parallel.tp_comm_backend == "auto";
#if ME_HAVE_CUDA_KERNELS
  auto* group = groups_->tp.get();
  const auto bytes = static_cast<size_t>(spec_.batch.micro * spec_.model.seq * spec_.model.hidden) *
                     (spec_.precision == "fp32" ? 4 : 2);
  std::string error;
  try {
    tp_peers_ = std::make_shared<kernels::PeerBuffers>(group->rank(), group->size(), bytes);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (all_ok(*group, error.empty(), device_)) {
    const auto mine = tp_peers_->handle();
    const auto n = static_cast<int64_t>(kernels::PeerBuffers::kHandleBytes);
    auto local = torch::from_blob(const_cast<uint8_t*>(mine.data()), {n}, torch::kByte).to(device_);
    auto all = torch::empty({n * group->size()}, torch::TensorOptions(torch::kByte).device(device_));
    group->all_gather(all, local);
    const auto host = all.cpu();
    try {
      tp_peers_->open(std::vector<uint8_t>(host.data_ptr<uint8_t>(), host.data_ptr<uint8_t>() + host.numel()));
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (all_ok(*group, error.empty(), device_)) {
      if (is_logging_rank())
        log::info("tensor-parallel collectives on the copy engines (parallel.tp_comm_backend = \"",
                  spec_.parallel.tp_comm_backend, "\"): peer buffers of 2 x ",
                  human::number(static_cast<double>(tp_peers_->slot_bytes()) / 1048576.0),
                  " MiB per GPU, outside LibTorch's allocator, mapped by the ", group->size(), " ranks of each tp group");
      return;
    }
  }
  tp_peers_.reset();
  if (error.empty()) error = "another rank of this tensor-parallel group could not allocate or map its peer buffers";
  if (!may_fall_back)
    fail("parallel.tp_comm_backend = \"copy_engine\": ", error, "; set it to \"nccl\"");
  log::warn("parallel.tp_comm_backend = \"auto\": the copy engines are not available (", error,
            "); NCCL moves the tensor-parallel collectives");
#else
  if (may_fall_back) return;  // NCCL, as "auto" says where the kernels are not built
  fail("parallel.tp_comm_backend = \"copy_engine\" needs this engine's CUDA kernels (a build with CUDA LibTorch and nvcc); ",
       "leave it \"auto\" or \"nccl\"");
#endif
}

// This rank's GPU time per step at the copy engines' timed barriers since the last log (tp_peers_
// counts it on the GPU), or -1 without them.
// With ME_TP_BARRIER_LOG=1 each rank also logs every timed barrier's wait by its place in the
// step (the mean over the steps since the last log, in us): which collective of which layer, forward
// or backward, waits, and on which rank.
double Trainer::tp_barrier_ms_per_step(int64_t steps) {
#if ME_HAVE_CUDA_KERNELS
  if (!tp_peers_ || steps <= 0) return -1;
  const auto waits = tp_peers_->timed_waits();
  const uint64_t now = waits.total_ns;
  const double ms = static_cast<double>(now - tp_barrier_ns_) / 1e6 / static_cast<double>(steps);
  tp_barrier_ns_ = now;
  static const bool by_place = [] {
    const char* v = std::getenv("ME_TP_BARRIER_LOG");
    return v && std::string(v) == "1";
  }();
  const uint64_t n = waits.count - tp_barrier_count_;
  tp_barrier_count_ = waits.count;
  if (by_place && n > 0 && n % static_cast<uint64_t>(steps) == 0 && n <= kernels::PeerBuffers::kWaitLog) {
    const uint64_t per_step = n / static_cast<uint64_t>(steps);
    std::string line = cat("TP barrier waits by place in the step (us, mean of ", steps, " steps): ");
    for (uint64_t place = 0; place < per_step; ++place) {
      double sum = 0;
      for (int64_t k = 0; k < steps; ++k) {
        const uint64_t i = waits.count - n + static_cast<uint64_t>(k) * per_step + place;
        sum += static_cast<double>(waits.ring[i % kernels::PeerBuffers::kWaitLog]);
      }
      line += cat(place ? " " : "", static_cast<int64_t>(std::lround(sum / static_cast<double>(steps) / 1000.0)));
    }
    log::info(line);
  }
  return ms;
#else
  (void)steps;
  return -1;
#endif
}

// This rank's pipeline stage and tensor-parallel slice of the model, its weights drawn at full
// size from the seed (the same model at every layout), in the training precision.
void Trainer::build_model() {
  const auto& par = spec_.parallel;
  stage_ = {0, static_cast<int>(par.pp), par.pp_first_layers, par.pp_last_layers};
  if (par.pp_split == "balanced" && par.pp > 1) {
    std::tie(stage_.first_layers, stage_.last_layers) =
        model::balanced_stage_split(spec_.model, static_cast<int>(par.pp), static_cast<int>(par.tp));
    stage_.stage_layers(spec_.model.layers);
  }
  if (groups_) stage_.index = groups_->pp->rank();
  parallel::TensorParallel tp;
  if (groups_) tp.group = groups_->tp.get();
  tp.sequence_parallel = par.sequence_parallel;
  tp.overlap_comm = par.tp_comm_overlap;
  tp.comm_sm_margin = static_cast<int>(par.tp_comm_sm_margin);
  tp.gather_ring = par.tp_gather == "ring";
  tp.delay_wgrad = par.tp_delay_wgrad;
  parallel::DelayedWeightGrad::set_own_stream(par.tp_wgrad_stream);
  if (groups_ && par.tp_symmetric_mb > 0) {
    auto* group = groups_->tp.get();
    const auto device = device_;
    tp_slots_ = std::make_unique<parallel::SymmetricSlots>(
        [group, device](int64_t bytes) {
          return group->empty_symmetric(bytes, torch::TensorOptions(torch::kByte).device(device));
        },
        static_cast<int64_t>(par.tp_symmetric_mb * 1048576));
    tp.slots = tp_slots_.get();
  }
  if (groups_ && par.tp > 1 && par.tp_backend(spec_.device) == "copy_engine") {
    open_tp_peers();
    tp.peers = tp_peers_.get();
  }
  model_ = model::Transformer(spec_.model, tp, stage_, /*initialize=*/false);
  model_->reset_parameters(static_cast<uint64_t>(spec_.seed));
  model_->to(device_, param_dtype(spec_.precision));
  if (spec_.precision == "fp8") {
    ME_CHECK(kernels::fp8_gemm_compiled() || config::fp8_emulated_for_tests(), "precision = \"fp8\": this build has no fp8 GEMMs (they need the engine's ",
             "CUDA kernels and a LibTorch with CUDA, as on the GPU machine); use precision = \"bf16\"");
    fp8_ = std::make_unique<kernels::Fp8Model>();
    fp8_->scaling = {spec_.fp8_scaling, spec_.fp8_amax_history, spec_.fp8_margin};
    parallel::attach_fp8(*model_, fp8_.get());
  }
  params_ = model_->parameters();
  flops_per_iteration_ = spec_.model.flops_per_token(static_cast<int>(par.tp)) * static_cast<double>(plan_.global) *
                         static_cast<double>(spec_.model.seq);
}

// fp32 master weights (sharded over dp with the distributed optimizer), the gradient buffer the
// linear layers write into, and the optimizer over both.
void Trainer::build_optimizer() {
  const auto& par = spec_.parallel;
  // Each parameter counts once in the gradient norm: the copy a checkpoint saves (TP rank 0's of a
  // replicated parameter, the first stage's of the tied word embedding).
  const auto pieces = model_->state_tensors(groups_ ? groups_->tp->rank() : 0);
  std::vector<optim::MasterParam> masters;
  const auto named = model_->named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    masters.push_back({named[i].value(), named[i].value().dim() >= 2, pieces[i].save});
    if (model_->shards().at(named[i].key()).sequence_parallel_grad) shared_grads_.sequence_parallel.push_back(i);
    if (model_->holds_shared_embedding() && named[i].key() == "embedding.weight")
      shared_grads_.tied_embedding = static_cast<int64_t>(i);
  }
  if (groups_) {
    shared_grads_.embedding_group = groups_->embedding.get();
    shared_grads_.tp_group = groups_->tp.get();
  }
  comm::ProcessGroup* dp = groups_ ? groups_->dp.get() : nullptr;
  grads_ = std::make_unique<parallel::GradBuffer>(params_, dp, par.bucket_mb, par.distributed_optimizer,
                                        par.symmetric_buffers == "all",
                                        par.grad_reduce_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat);
  parallel::attach_main_grads(*model_, par.grad_accumulation_fusion ? grads_.get() : nullptr);
  // The tied embedding's gradient is summed over the stages holding it before its DP reduction.
  if (shared_grads_.tied_embedding >= 0) grads_->defer(static_cast<size_t>(shared_grads_.tied_embedding));
  // The distributed optimizer all-gathers updated parameters in place: they move into one flat
  // buffer laid out like the gradients.
  torch::Tensor flat_params;
  if (par.distributed_optimizer && plan_.dp > 1) flat_params = grads_->adopt_params(par.symmetric_buffers != "none");
  optim::OptimizerConfig config;
  config.options = spec_.optim;
  config.distributed = par.distributed_optimizer;
  config.overlap_param_gather = par.overlap_param_gather;
  optimizer_ = std::make_unique<optim::MasterOptimizer>(std::move(masters), grads_->flat(), grads_->layout(), config,
                                                        groups_ ? groups_->model_parallel.get() : nullptr, dp,
                                                        flat_params);
  if (flat_params.defined() && par.overlap_param_gather)
    model_->set_before_use([opt = optimizer_.get()](torch::nn::Module& part) {
      for (const auto& p : part.parameters()) opt->wait_for(p);
    });
}

// Weight gradients are held back only where a pipeline has bubbles to fill, and only those the
// linear layers write into the buffer (gradient-accumulation fusion).
void Trainer::build_pipeline() {
  const auto& par = spec_.parallel;
  pipeline_ = std::make_unique<PipelineSchedule>(*model_, groups_ ? groups_->pp.get() : nullptr,
                                                 par.pp > 1 ? par.pp_deferred_wgrads : 0,
                                                 par.grad_accumulation_fusion ? grads_.get() : nullptr);
}

// train.cuda_graphs: the recipe's check refused the settings the graphs cannot hold; what only the
// run can know is refused here, naming the field to change.
void Trainer::build_block_graphs() {
  if (!spec_.train.cuda_graphs) return;
  const auto& par = spec_.parallel;
  auto refuse = [](const std::string& why, const std::string& fix) { fail(config::cuda_graphs_refusal(why, fix)); };
  if (!model::block_graphs_built()) refuse("this build's LibTorch has no CUDA", "use the GPU build");
  if (par.tp > 1 && !tp_peers_)
    refuse(cat("parallel.tp = ", par.tp, " needs the copy engines' collectives inside the graphs, and they did not ",
               "open here (the log says why; NCCL's are not captured)"),
           "run the tensor-parallel group on GPUs of one node with peer access");
  grads_->set_zero_each_step(true);
  model::GraphGradHooks hooks;
  auto* grads = grads_.get();
  hooks.take_captured_writes = [grads] { return grads->take_captured_writes(); };
  hooks.mark_written = [grads](const torch::Tensor& p) { grads->mark_written(p); };
  block_graphs_ = std::make_shared<model::BlockGraphs>(model_->tensor_parallel(), model_->block_count(), std::move(hooks));
  model_->set_block_graphs(block_graphs_);
}

void Trainer::log_start() const {
  const auto& par = spec_.parallel;
  log::info("training ", spec_.name, ": ", spec_.model.describe(), ", ",
            spec_.model.parameter_count(static_cast<int>(par.tp)), " parameters (", model_->local_parameter_count(),
            " on this rank), ", spec_.precision, " on ", device_.str(), "; ", plan_.iters, " iterations of ",
            plan_.global, " samples (micro ", spec_.batch.micro, " x dp ", plan_.dp, " x accumulation ",
            plan_.accumulation, ")");
  log::info("data: ", data_->describe());
  if (fp8_)
    log::info("fp8: the transformer blocks' linear layers' GEMMs in fp8 (E4M3 weights and activations, E5M2 output ",
              "gradients), ", spec_.fp8_scaling, " per-tensor scaling",
              spec_.fp8_scaling == "delayed" ? cat(" over ", spec_.fp8_amax_history, " casts of amax history") : "",
              spec_.fp8_margin > 0 ? cat(", margin 2^", spec_.fp8_margin) : "", "; the output layer in bf16");
  log::info("deterministic: ", spec_.train.deterministic ? "on (train.deterministic): " + deterministic_settings_
                                                          : std::string("off (train.deterministic = false)"));
  if (const int pp = pipeline_->stages(); pp > 1) {
    std::string split;
    for (const int64_t n : stage_.stage_layers(spec_.model.layers)) split += (split.empty() ? "" : "/") + std::to_string(n);
    log::info("pipeline: ", pp, " stages of ", split, " layers (pp_split ", par.pp_split, "), 1F1B over ",
              plan_.accumulation, " micro-batches per step (its idle share (pp - 1) / (micro-batches + pp - 1) = ",
              std::round(1000.0 * (pp - 1) / static_cast<double>(plan_.accumulation + pp - 1)) / 10,
              "%), pp_deferred_wgrads ", par.pp_deferred_wgrads);
    if (plan_.accumulation < pp)
      log::warn("only ", plan_.accumulation, " micro-batches per step for ", pp,
                " pipeline stages: most of each step is idle; raise batch.global to at least ",
                pp * spec_.batch.micro * plan_.dp);
  }
  if (device_.is_cuda())
    log::info("fused CUDA kernels: ", kernels::describe(), "; attention: ", compat::attention_backend_name());
  if (par.distributed_optimizer)
    log::info("distributed optimizer: ", human::number(optimizer_->state_bytes() / 1048576.0), " MiB of fp32 masters and state on ",
              "this rank instead of ", human::number(optimizer_->unsharded_state_bytes() / 1048576.0), " MiB");
  if (par.grad_reduce_dtype == "bf16")
    log::info("gradients accumulated and reduced in bf16 (parallel.grad_reduce_dtype): ",
              human::number(grads_->flat().nbytes() / 1048576.0), " MiB buffer on this rank");
  if (grads_->symmetric_bytes() > 0 && comm_->backend() == "nccl")
    log::info("symmetric buffers (", par.symmetric_buffers, "): ", human::number(grads_->symmetric_bytes() / 1048576.0),
              " MiB registered with the data-parallel NCCL group, outside LibTorch's allocator (not in its peak)");
}

}  // namespace me::train
