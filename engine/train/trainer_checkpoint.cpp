// The trainer's checkpoints: what a rank saves (its pieces of the model, of the fp32 master
// weights and of the optimizer state, named as in the whole model so that any layout can load
// them), when (checkpoint.interval, train.exit_interval, a stop signal, the end), and resuming.

#include <chrono>

#include "engine/hf/convert.h"
#include "engine/core/format.h"
#include "engine/core/error.h"
#include "engine/core/files.h"
#include "engine/core/exit_status.h"
#include "engine/core/log.h"
#include "engine/core/stop_signals.h"
#include "engine/core/torch_compat.h"
#include "engine/train/resume_check.h"
#include "engine/train/trainer.h"

namespace me::train {

using checkpoint::StateTensor;

namespace {

const char* signal_label(int sig) {
  return sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT (Ctrl-C)" : "a signal";
}

}  // namespace

// ---- what is saved -----------------------------------------------------------------------

std::vector<StateTensor> Trainer::state_tensors() const {
  // The model's pieces and the optimizer's state over them (its masters and moments), saved by
  // the first data-parallel rank unless the distributed optimizer shards them.
  auto out = model_->state_tensors(groups_ ? groups_->tp->rank() : 0);
  auto optimizer = optimizer_->state_tensors(out);
  for (auto& t : out) t.save = t.save && plan_.dp_rank == 0;
  out.insert(out.end(), std::make_move_iterator(optimizer.begin()), std::make_move_iterator(optimizer.end()));
  if (fp8_) out.push_back(fp8_state());
  // The generators' states: every rank's are the same (nothing draws per rank), rank 0 saves.
  const bool rank0 = !comm_ || comm_->rank() == 0;
  for (const auto& [name, state] : {std::pair{"rng.cpu", compat::cpu_rng_state()}, {"rng.cuda", compat::cuda_rng_state()}}) {
    if (!state.defined()) continue;
    StateTensor t;
    t.name = name;
    t.tensor = state;
    t.global_shape = state.sizes().vec();
    t.flat_length = state.numel();
    t.save = rank0;
    out.push_back(std::move(t));
  }
  return out;
}

// precision = "fp8": every fp8 layer's scales and amax histories on this rank, one tensor saved
// by each rank under its own name (they differ per rank: each sees its own tensors' amax), so
// that a resumed run casts with the same scales. A run at another layout starts them afresh.
StateTensor Trainer::fp8_state() const {
  std::vector<torch::Tensor> parts;
  for (auto* layer : parallel::fp8_layers(*model_)) parts.push_back(layer->scales.state());
  StateTensor t;
  t.name = cat("fp8.scales.rank", comm_ ? comm_->rank() : 0);
  t.tensor = torch::cat(parts);
  t.global_shape = t.tensor.sizes().vec();
  t.flat_length = t.tensor.numel();
  return t;
}

void Trainer::load_fp8_state(checkpoint::CheckpointReader& reader, const StateTensor& t) {
  const auto& saved = reader.metadata().tensors;
  const auto it = saved.find(t.name);
  if (it == saved.end() || it->second.shape != t.global_shape) {
    if (is_logging_rank())
      log::info("fp8: ", reader.path(), " holds no fp8 scales for this layout (saved by a ",
                reader.metadata().layout.precision, " run or another layout): they start afresh");
    return;
  }
  reader.load(t);
  int64_t at = 0;
  for (auto* layer : parallel::fp8_layers(*model_)) {
    const int64_t n = layer->scales.state().numel();
    layer->scales.load_state(t.tensor.narrow(0, at, n));
    at += n;
  }
}

checkpoint::Metadata Trainer::checkpoint_metadata() const {
  checkpoint::Metadata m;
  m.iteration = iteration_;
  m.consumed_samples = consumed_samples();
  m.skipped = skipped_;
  m.nan = nan_;
  m.optimizer_steps = optimizer_->steps();
  if (scaler_) {
    const auto st = scaler_->state();
    m.loss_scale = st.scale;
    m.loss_scale_good_steps = st.good_steps;
    m.loss_scale_hysteresis_left = st.hysteresis_left;
  }
  m.vocab = spec_.model.vocab;
  m.recipe_json = checkpoint::recipe_to_json(spec_);
  m.layout.world = comm_ ? comm_->world_size() : 1;
  m.layout.tp = spec_.parallel.tp;
  m.layout.pp = spec_.parallel.pp;
  m.layout.dp = plan_.dp;
  m.layout.stage_layers = stage_.stage_layers(spec_.model.layers);
  m.layout.distributed_optimizer = spec_.parallel.distributed_optimizer;
  m.layout.precision = spec_.precision;
  return m;
}

// ---- resuming ----------------------------------------------------------------------------

// Before the first step, so that a directory the run cannot write fails in seconds instead of
// at the first save: every rank writes its shards into checkpoint.dir, rank 0 its metrics.
void Trainer::check_output_dirs() {
  if (!spec_.checkpoint.dir.empty()) checkpoint::probe_writable("checkpoint.dir", spec_.checkpoint.dir);
  if (is_logging_rank() && !spec_.log.dir.empty()) checkpoint::probe_writable("log.dir", spec_.log.dir);
}

// Before the data opens: removes what crashed saves left, and finds the checkpoint to resume
// from (checkpoint.dir's latest, else checkpoint.load), whose data position the data needs.
void Trainer::find_checkpoint() {
  const auto& c = spec_.checkpoint;
  const bool rank0 = !comm_ || comm_->rank() == 0;
  bool from_dir = false;
  if (!c.dir.empty()) {
    checkpoint::CheckpointDir dir(c.dir);
    if (rank0) {
      dir_lock_ = std::make_unique<checkpoint::DirLock>(c.dir);  // before anything in it changes
      for (const auto& left : dir.remove_leftovers())
        log::info("checkpoint: removed ", c.dir, "/", left, ", left by a save that did not finish");
      settle_checkpoint_dir(dir);
    }
    if (comm_) comm_->world()->barrier();  // the others look only once rank 0 has cleaned up
    if (const auto latest = dir.latest()) resume_from_ = dir.iteration_path(*latest);
    from_dir = !resume_from_.empty();
    checkpoint::SaverOptions o;
    o.dir = c.dir;
    o.keep = c.keep;
    o.async = c.async;
    if (const char* slow = std::getenv("ME_TEST_CHECKPOINT_SLOW_MS")) o.slow_ms = std::atoi(slow);
    saver_ = std::make_unique<checkpoint::CheckpointSaver>(o, comm_.get());
  }
  const bool from_hf = resume_from_.empty() && c.load.rfind("hf:", 0) == 0;
  if (from_hf) {  // Hugging Face weights, converted once
    resume_from_ = hf::import_hf_for_run(c.load.substr(3), spec_.model, c.dir, rank0 ? 0 : comm_->rank(),
                                         comm_ ? comm_->world_size() : 1, [this] { comm_->world()->barrier(); });
  } else if (resume_from_.empty() && !c.load.empty()) {
    resume_from_ = c.iteration > 0 ? checkpoint::iteration_dir(c.load, c.iteration, "checkpoint.iteration")
                                   : checkpoint::resolve_iteration_dir(c.load);
    weights_only_ = c.weights_only;
  }
  if (resume_from_.empty()) return;
  const auto file = files::join(resume_from_, checkpoint::kMetadataFile);
  const auto m = checkpoint::Metadata::parse(checkpoint::read_file(file), file);
  if (!from_hf) check_resume(m, from_dir);
  resume_consumed_ = weights_only_ ? 0 : m.consumed_samples;
}

void Trainer::settle_checkpoint_dir(const checkpoint::CheckpointDir& dir) {
  if (!dir.latest())
    if (const auto note = dir.recover_tracker(); !note.empty()) log::warn("checkpoint: ", note);
  if (spec_.checkpoint.iteration > 0)
    if (const auto note = dir.rewind(spec_.checkpoint.iteration); !note.empty()) log::warn("checkpoint: ", note);
}

namespace {
std::string lines(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += "\n  " + i;
  return out;
}
}  // namespace

void Trainer::check_resume(const checkpoint::Metadata& m, bool from_dir) {
  const auto& c = spec_.checkpoint;
  const auto saved = checkpoint::recipe_from_json(m.recipe_json, files::join(resume_from_, checkpoint::kMetadataFile));
  const auto diffs = model_differences(spec_.model, saved.model);
  if (!diffs.empty() && from_dir)
    fail("checkpoint.dir '", c.dir, "' holds a checkpoint of another model (", resume_from_, "):", lines(diffs),
         "\nset those model fields to the checkpoint's values to resume it; for a new model use a new checkpoint.dir ",
         "(checkpoint.load=", c.dir, " checkpoint.weights_only=true starts it from these weights)");
  if (!diffs.empty() && !weights_only_)
    fail("checkpoint.load '", c.load, "' is a checkpoint of another model (", resume_from_, "):", lines(diffs),
         "\nset those model fields to the checkpoint's values, or checkpoint.weights_only=true to start from its ",
         "weights deliberately (a fresh optimizer at iteration 0)");
  if (!diffs.empty() && is_logging_rank())
    log::warn("checkpoint.weights_only: ", resume_from_, " is of another model; its weights are loaded where the ",
              "shapes fit:", lines(diffs));
  // Weights alone (weights_only, or an import: no schedule of its own) start the recipe's schedule.
  if (weights_only_ || m.iteration == 0 || saved.schedule.kind.empty()) return;
  const auto then = saved_schedule(saved, m.layout.dp);
  const auto changed = schedule_differences(lr_schedule_, then);
  if (changed.empty()) return;
  if (!c.override_schedule) lr_schedule_ = then;
  if (is_logging_rank())
    log::warn("the learning-rate schedule differs from the one of the checkpoint's run:", lines(changed),
              c.override_schedule ? "\nfollowing the recipe's (checkpoint.override_schedule = true): the rate may jump here"
                                  : "\nkeeping the checkpoint's, so that the rate does not jump at the resume; set "
                                    "checkpoint.override_schedule=true to follow the recipe's");
}

void Trainer::resume() {
  if (resume_from_.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  checkpoint::CheckpointReader reader(resume_from_);
  load_state(reader);
  hf::release_temp_conversion(resume_from_);  // an hf: conversion is not needed once loaded
  if (device_.is_cuda()) compat::cuda_synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& l = reader.metadata().layout;
  if (weights_only_ && is_logging_rank())
    log::info("started from the weights of ", resume_from_, " (checkpoint.weights_only): iteration 0, a fresh ",
              "optimizer, the data from its start; loaded in ", human::number(seconds), " s");
  else if (is_logging_rank())
    log::info("resumed from ", resume_from_, " (saved at tp ", l.tp, " x pp ", l.pp, " x dp ", l.dp,
              l.distributed_optimizer ? " with the distributed optimizer" : "", "): iteration ", iteration_,
              ", consumed samples ", consumed_samples(), "; loaded in ", human::number(seconds), " s");
  last_saved_ = iteration_;
}

namespace {
// Whether a checkpoint holds optimizer state: one of weights alone (Hugging Face weights
// imported, say) starts a fresh optimizer from them.
bool holds_optimizer_state(const checkpoint::Metadata& m) {
  for (const auto& [name, t] : m.tensors)
    if (name.rfind("exp_avg.", 0) == 0 || name.rfind("momentum.", 0) == 0) return true;
  return false;
}
}  // namespace

void Trainer::load_state(checkpoint::CheckpointReader& reader) {
  const auto& m = reader.metadata();
  const bool fresh_optimizer = weights_only_ || !holds_optimizer_state(m);
  if (fresh_optimizer && !weights_only_ && is_logging_rank())
    log::info(reader.path(), " holds weights only: the optimizer starts afresh from them");
  for (const auto& t : state_tensors()) {
    const std::string kind = t.name.substr(0, t.name.find('.')), rest = t.name.substr(t.name.find('.') + 1);
    if (fresh_optimizer && (kind == "exp_avg" || kind == "exp_avg_sq" || kind == "momentum")) {
      t.tensor.detach().zero_();
      continue;
    }
    std::string source = t.name;
    // fp32 weights from fp32 masters where a bf16 run saved both; masters from the weights
    // where an fp32 run saved no separate ones.
    if (kind == "model" && t.tensor.scalar_type() == torch::kFloat && reader.has("master." + rest)) source = "master." + rest;
    if (kind == "master" && !reader.has(t.name)) source = "model." + rest;
    if (kind == "rng" && (weights_only_ || !reader.has(t.name))) continue;  // saved without a GPU, say
    if (kind == "fp8") {
      if (!weights_only_) load_fp8_state(reader, t);
      continue;
    }
    reader.load(t, source);
    if (t.name == "rng.cpu") compat::set_cpu_rng_state(t.tensor);
    if (t.name == "rng.cuda") compat::set_cuda_rng_state(t.tensor);
  }
  if (weights_only_) return;  // a new run from these weights
  iteration_ = m.iteration;
  skipped_ = m.skipped;
  nan_ = m.nan;
  optimizer_->set_steps(m.optimizer_steps);
  if (scaler_ && m.loss_scale > 0) scaler_->set_state({m.loss_scale, m.loss_scale_good_steps, m.loss_scale_hysteresis_left});
}

void Trainer::load(const std::string& path) {
  optimizer_->wait_params();
  checkpoint::CheckpointReader reader(checkpoint::resolve_iteration_dir(path));
  load_state(reader);
  // The data continues where the checkpoint's run was.
  resume_consumed_ = reader.metadata().consumed_samples;
  open_data();
  last_saved_ = iteration_;
  if (is_logging_rank())
    log::info("loaded ", reader.path(), ": iteration ", iteration_, ", consumed samples ", consumed_samples());
}

// ---- saving --------------------------------------------------------------------------------

void Trainer::save(const std::string& dir) {
  checkpoint::SaverOptions o;
  o.dir = dir;
  o.async = false;
  checkpoint::CheckpointSaver saver(o, comm_.get());
  optimizer_->wait_params();
  saver.save(state_tensors(), checkpoint_metadata());
  saver.finish();
}

void Trainer::save_checkpoint() {
  optimizer_->wait_params();  // the distributed optimizer's all-gathers, when still in flight
  saver_->save(state_tensors(), checkpoint_metadata());
  last_saved_ = iteration_;
}

int Trainer::after_step(Summary& s) {
  if (saver_ && saver_->pending() && !agreed_.writing) saver_->commit_if_done(true);
  const int sig = agreed_.stop_signal;
  const int64_t every = spec_.train.exit_interval;
  const bool exit_here = every > 0 && iteration_ % every == 0;
  const bool stop = sig != 0 || exit_here || stop_non_finite_;
  const bool on_interval = spec_.checkpoint.interval > 0 && iteration_ % spec_.checkpoint.interval == 0;
  if (saver_ && (on_interval || (stop && spec_.checkpoint.save_on_exit))) save_checkpoint();
  if (!stop) return -1;
  if (saver_) saver_->finish();
  const bool saved = saver_ && saver_->committed_iteration() == iteration_;
  const bool lost = saver_ && saver_->attempted_iteration() == iteration_ && !saved;
  s.stopped = sig               ? cat(signal_label(sig), " at iteration ", iteration_)
              : stop_non_finite_ ? cat(consecutive_nan_, " steps in a row with a non-finite gradient at iteration ", iteration_)
                                 : cat("train.exit_interval at iteration ", iteration_);
  if (is_logging_rank())
    log::info("stopping: ", s.stopped, saved ? "; a checkpoint of it was saved" : "; nothing was saved",
              sig && !saver_ ? " (set checkpoint.dir to save on a signal)" : "");
  if (lost) return final_save_status();
  if (stop_non_finite_) {
    if (is_logging_rank())
      log::error("training stopped: ", s.stopped, " (train.nan_policy = \"stop\"). What usually helps: a lower ",
                 "optimizer.lr, clipping (optimizer.clip), a longer warm-up (schedule.warmup_iters), bf16 instead of ",
                 "fp16; the warnings above name the parameter and rank where it began");
    return kExitNonFinite;
  }
  if (!sig) return kExitOk;
  return saved ? kExitRequeue : 128 + sig;
}

void Trainer::finish_checkpoints() {
  if (!saver_) return;
  if (spec_.checkpoint.save_on_exit && last_saved_ != iteration_) save_checkpoint();
  saver_->finish();
}

int Trainer::final_save_status() {
  if (!saver_ || saver_->attempted_iteration() != iteration_ || saver_->committed_iteration() == iteration_) return kExitOk;
  const auto latest = checkpoint::CheckpointDir(spec_.checkpoint.dir).committed();
  if (is_logging_rank())
    log::error("the final checkpoint, iteration ", iteration_, ", was NOT saved to ", spec_.checkpoint.dir, ": ",
               saver_->failure(), ". ",
               saver_->committed_iteration() >= 0
                   ? cat("The latest saved by this run is iteration ", saver_->committed_iteration())
                   : std::string("This run saved no checkpoint"),
               " (", spec_.checkpoint.dir, " holds iterations ", checkpoint::iteration_list(latest),
               "): the work since then is lost. Free space or fix the directory, then run again to resume");
  return kExitError;
}

}  // namespace me::train
