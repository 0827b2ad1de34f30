// Training from Lua: a recipe table becomes a RunSpec (config is data), then a Trainer that
// Lua can step, run, evaluate and sample from. Lua hooks (`on_log`) are called from the loop.
#include <torch/torch.h>

#include "bindings/lua_model.h"
#include "bindings/lua_tensor.h"
#include "bindings/modules.h"
#include "engine/core/log.h"
#include "engine/train/trainer.h"

namespace me::lua {
namespace {

const char* const kTrainerMeta = "me.Trainer";

struct LuaTrainer {
  std::unique_ptr<train::Trainer> trainer;
  lua_State* owner = nullptr;
  int hook_ref = LUA_NOREF;
  ~LuaTrainer() {
    if (owner && hook_ref != LUA_NOREF) luaL_unref(owner, LUA_REGISTRYINDEX, hook_ref);
  }
};

}  // namespace

// recipe.data: me.data.text{} or me.data.gpt{} (table at absolute index t).
train::DataSpec read_data_spec(lua_State* L, int t) {
  train::DataSpec d;
  d.kind = field_string(L, t, "kind", "data", d.kind);
  if (d.kind == "text") {
    d.path = field_string(L, t, "path", "data");
    d.holdout = field_number(L, t, "holdout", "data", d.holdout);
    return d;
  }
  ME_CHECK(d.kind == "gpt", "data.kind '", d.kind, "' is unknown: use me.data.text{} or me.data.gpt{}");
  const std::string prefix = field_string(L, t, "prefix", "data", std::string());
  if (!prefix.empty()) d.blend.emplace_back(1.0, prefix);
  if (push_field_table(L, t, "blend", "data")) {  // { {weight, prefix}, ... }: an array, read by index
    const int b = lua_gettop(L);
    const auto n = static_cast<int>(lua_rawlen(L, b));
    for (int i = 1; i <= n; ++i) {
      lua_rawgeti(L, b, i);
      const bool ok = lua_istable(L, -1) && lua_rawlen(L, -1) == 2;
      double w = 0;
      std::string p;
      if (ok) {
        lua_rawgeti(L, -1, 1);
        lua_rawgeti(L, -2, 2);
        if (lua_type(L, -2) == LUA_TNUMBER && lua_type(L, -1) == LUA_TSTRING) {
          w = lua_tonumber(L, -2);
          p = lua_tostring(L, -1);
        }
        lua_pop(L, 2);
      }
      lua_pop(L, 1);
      ME_CHECK(!p.empty(), "data.blend[", i, "]: expected {weight, prefix}, e.g. blend = { {0.3, \"/fsx/a_text_document\"}, ",
               "{0.7, \"/fsx/b_text_document\"} }");
      d.blend.emplace_back(w, p);
    }
    lua_pop(L, 1);
  }
  ME_CHECK(!d.blend.empty(), "me.data.gpt: give data.prefix (a .bin/.idx prefix) or data.blend = { {weight, prefix}, ... }");
  ME_CHECK(prefix.empty() || d.blend.size() == 1, "me.data.gpt: give either data.prefix or data.blend, not both");
  d.split = field_string(L, t, "split", "data", d.split);
  d.cache_dir = field_string(L, t, "cache_dir", "data", d.cache_dir);
  d.eod_mask_loss = field_boolean(L, t, "eod_mask_loss", "data", d.eod_mask_loss);
  d.source = field_string(L, t, "source", "data", d.source);
  d.source_format = field_string(L, t, "source_format", "data", d.source_format);
  d.json_key = field_string(L, t, "json_key", "data", d.json_key);
  ME_CHECK(d.source.empty() || d.blend.size() == 1, "data.source needs a single data.prefix to preprocess into");
  if (push_field_table(L, t, "tokenizer", "data")) {
    d.tokenizer = read_tokenizer_spec(L, lua_gettop(L), "data.tokenizer");
    lua_pop(L, 1);
  }
  return d;
}

namespace {

// Reads the recipe at stack index r (absolute) into a RunSpec.
train::RunSpec read_run_spec(lua_State* L, int r) {
  train::RunSpec s;
  s.name = field_string(L, r, "name", "recipe", s.name);
  s.device = field_string(L, r, "device", "recipe", s.device);
  s.seed = static_cast<uint64_t>(field_integer(L, r, "seed", "recipe", static_cast<int64_t>(s.seed)));
  s.precision = field_string(L, r, "precision", "recipe", s.precision);

  if (!push_field_table(L, r, "model", "recipe")) fail("recipe.model is missing: add model = me.model.gpt{...}");
  s.model = read_model_config(L, lua_gettop(L), "model");
  lua_pop(L, 1);

  if (!push_field_table(L, r, "data", "recipe"))
    fail("recipe.data is missing: add data = me.data.text{ path = ... }");
  int t = lua_gettop(L);
  s.data = read_data_spec(L, t);
  lua_pop(L, 1);

  if (push_field_table(L, r, "optimizer", "recipe")) {
    t = lua_gettop(L);
    auto& o = s.optim;
    o.kind = field_string(L, t, "kind", "optimizer", o.kind);
    o.lr = field_number(L, t, "lr", "optimizer", o.lr);
    o.eps = field_number(L, t, "eps", "optimizer", o.eps);
    o.weight_decay = field_number(L, t, "weight_decay", "optimizer", o.weight_decay);
    o.clip = field_number(L, t, "clip", "optimizer", o.clip);
    o.momentum = field_number(L, t, "momentum", "optimizer", o.momentum);
    if (push_field_table(L, t, "betas", "optimizer")) {  // a Lua array: read by index
      ME_CHECK(lua_rawlen(L, -1) == 2, "optimizer.betas: expected two numbers {beta1, beta2}, got ", lua_rawlen(L, -1),
               " values");
      for (int i = 1; i <= 2; ++i) {
        lua_rawgeti(L, -1, i);
        ME_CHECK(lua_type(L, -1) == LUA_TNUMBER, "optimizer.betas[", i, "]: expected a number, got ",
                 luaL_typename(L, -1));
        (i == 1 ? o.beta1 : o.beta2) = lua_tonumber(L, -1);
        lua_pop(L, 1);
      }
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  if (push_field_table(L, r, "schedule", "recipe")) {
    t = lua_gettop(L);
    auto& sc = s.schedule.schedule;
    sc.kind = optim::LRSchedule::parse_kind(field_string(L, t, "kind", "schedule", std::string("cosine")));
    sc.min_lr = field_number(L, t, "min_lr", "schedule", 0.0);
    // Megatron's --lr-warmup-samples / --lr-decay-samples: when given, the schedule counts samples.
    const int64_t warmup_samples = field_integer(L, t, "warmup_samples", "schedule", 0);
    const int64_t decay_samples = field_integer(L, t, "decay_samples", "schedule", 0);
    const int64_t wsd_samples = field_integer(L, t, "wsd_decay_samples", "schedule", 0);
    s.schedule.in_samples = warmup_samples > 0 || decay_samples > 0 || wsd_samples > 0;
    if (s.schedule.in_samples) {
      sc.warmup = warmup_samples;
      sc.decay = decay_samples;
      sc.wsd_decay = wsd_samples;
    } else {
      sc.warmup = field_integer(L, t, "warmup_iters", "schedule", 0);
      sc.decay = field_integer(L, t, "decay_iters", "schedule", 0);
      sc.wsd_decay = field_integer(L, t, "wsd_decay_iters", "schedule", 0);
    }
    lua_pop(L, 1);
  }
  if (push_field_table(L, r, "batch", "recipe")) {
    s.train.micro_batch = field_integer(L, lua_gettop(L), "micro", "batch", s.train.micro_batch);
    s.train.global_batch = field_integer(L, lua_gettop(L), "global", "batch", s.train.global_batch);
    lua_pop(L, 1);
  }
  if (push_field_table(L, r, "train", "recipe")) {
    t = lua_gettop(L);
    auto& tr = s.train;
    tr.iters = field_integer(L, t, "iters", "train", tr.iters);
    tr.samples = field_integer(L, t, "samples", "train", tr.samples);
    tr.peak_tflops = field_number(L, t, "peak_tflops", "train", tr.peak_tflops);
    tr.profile_phases = field_boolean(L, t, "profile_phases", "train", tr.profile_phases);
    tr.profile_at = field_integer(L, t, "profile_at", "train", tr.profile_at);
    tr.profile_steps = field_integer(L, t, "profile_steps", "train", tr.profile_steps);
    tr.profile_trace = field_string(L, t, "profile_trace", "train", tr.profile_trace);
    tr.log_interval = field_integer(L, t, "log_interval", "train", tr.log_interval);
    tr.eval_interval = field_integer(L, t, "eval_interval", "train", tr.eval_interval);
    tr.eval_iters = field_integer(L, t, "eval_iters", "train", tr.eval_iters);
    lua_pop(L, 1);
  }
  if (push_field_table(L, r, "parallel", "recipe")) {
    t = lua_gettop(L);
    auto& p = s.parallel;
    p.tp = field_integer(L, t, "tp", "parallel", p.tp);
    p.pp = field_integer(L, t, "pp", "parallel", p.pp);
    p.pp_first_layers = field_integer(L, t, "pp_first_layers", "parallel", p.pp_first_layers);
    p.pp_last_layers = field_integer(L, t, "pp_last_layers", "parallel", p.pp_last_layers);
    p.pp_deferred_wgrads = field_integer(L, t, "pp_deferred_wgrads", "parallel", p.pp_deferred_wgrads);
    p.pp_split = field_string(L, t, "pp_split", "parallel", p.pp_split);
    p.sequence_parallel = field_boolean(L, t, "sequence_parallel", "parallel", p.sequence_parallel);
    p.distributed_optimizer = field_boolean(L, t, "distributed_optimizer", "parallel", p.distributed_optimizer);
    p.bucket_mb = field_number(L, t, "bucket_mb", "parallel", p.bucket_mb);
    p.grad_accumulation_fusion =
        field_boolean(L, t, "grad_accumulation_fusion", "parallel", p.grad_accumulation_fusion);
    p.tp_comm_overlap = field_boolean(L, t, "tp_comm_overlap", "parallel", p.tp_comm_overlap);
    p.tp_comm_sm_margin = field_integer(L, t, "tp_comm_sm_margin", "parallel", p.tp_comm_sm_margin);
    p.overlap_param_gather = field_boolean(L, t, "overlap_param_gather", "parallel", p.overlap_param_gather);
    p.symmetric_buffers = field_string(L, t, "symmetric_buffers", "parallel", p.symmetric_buffers);
    p.grad_reduce_dtype = field_string(L, t, "grad_reduce_dtype", "parallel", p.grad_reduce_dtype);
    p.tp_symmetric_mb = field_number(L, t, "tp_symmetric_mb", "parallel", p.tp_symmetric_mb);
    lua_pop(L, 1);
  }
  if (push_field_table(L, r, "comm", "recipe")) {
    t = lua_gettop(L);
    s.comm.backend = field_string(L, t, "backend", "comm", s.comm.backend);
    s.comm.timeout_s = field_number(L, t, "timeout_s", "comm", s.comm.timeout_s);
    s.comm.heartbeat_s = field_number(L, t, "heartbeat_s", "comm", s.comm.heartbeat_s);
    s.comm.nccl_cta_policy = field_string(L, t, "nccl_cta_policy", "comm", s.comm.nccl_cta_policy);
    ME_CHECK(s.comm.timeout_s > 0 && s.comm.heartbeat_s > 0, "comm.timeout_s and comm.heartbeat_s must be positive");
    lua_pop(L, 1);
  }
  if (push_field_table(L, r, "sample", "recipe")) {
    t = lua_gettop(L);
    auto& sp = s.sample;
    sp.prompt = field_string(L, t, "prompt", "sample", sp.prompt);
    sp.tokens = field_integer(L, t, "tokens", "sample", sp.tokens);
    sp.top_k = field_integer(L, t, "top_k", "sample", sp.top_k);
    sp.temperature = field_number(L, t, "temperature", "sample", sp.temperature);
    ME_CHECK(sp.tokens >= 0 && sp.top_k >= 1 && sp.temperature > 0,
             "sample: tokens must be >= 0, top_k >= 1 and temperature > 0");
    lua_pop(L, 1);
  }
  if (push_field_table(L, r, "log", "recipe")) {
    const auto level = field_string(L, lua_gettop(L), "level", "log", std::string("info"));
    log::set_level(log::parse_level(level));
    log::init_from_env();  // ME_LOG_LEVEL still wins over the recipe
    lua_pop(L, 1);
  }
  return s;
}

void push_record(lua_State* L, const train::LogRecord& rec) {
  lua_createtable(L, 0, 10);
  auto set_i = [&](const char* k, int64_t v) { lua_pushinteger(L, v); lua_setfield(L, -2, k); };
  auto set_n = [&](const char* k, double v) { lua_pushnumber(L, v); lua_setfield(L, -2, k); };
  set_i("iteration", rec.iteration);
  set_i("iters", rec.iters);
  set_i("consumed_samples", rec.consumed_samples);
  set_n("lr", rec.lr);
  set_n("loss", rec.loss);
  set_n("grad_norm", rec.grad_norm);
  set_n("ms_per_iter", rec.ms_per_iter);
  set_n("tokens_per_s", rec.tokens_per_s);
  set_n("tflops_per_gpu", rec.tflops_per_gpu);
  set_n("mfu", rec.mfu);
  if (rec.phase_ms[1] > 0) {  // train.profile_phases: { data =, forward =, ... } ms per iteration
    lua_createtable(L, 0, 5);
    for (int i = 0; i < 5; ++i) {
      lua_pushnumber(L, rec.phase_ms[i]);
      lua_setfield(L, -2, train::LogRecord::kPhaseNames[i]);
    }
    lua_setfield(L, -2, "phases");
  }
  set_i("global_batch", rec.global_batch);
  set_i("skipped", rec.skipped);
  if (rec.val_loss >= 0) set_n("val_loss", rec.val_loss);
}

int new_trainer(lua_State* L) {
  check_table(L, 1);
  lua_settop(L, 1);
  auto spec = read_run_spec(L, 1);
  auto* lt = push_object<LuaTrainer>(L, kTrainerMeta);
  lt->owner = L;
  lua_getfield(L, 1, "on_log");
  if (lua_isfunction(L, -1)) lt->hook_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  else lua_pop(L, 1);
  lt->trainer = std::make_unique<train::Trainer>(std::move(spec));
  return 1;
}

LuaTrainer& check_trainer(lua_State* L, int arg) { return check_object<LuaTrainer>(L, arg, kTrainerMeta, "trainer"); }

// Hooks run on the thread that called step/run (a coroutine in the REPL, say).
void attach_hook(lua_State* L, LuaTrainer& lt) {
  if (lt.hook_ref == LUA_NOREF) return;
  const int ref = lt.hook_ref;
  lt.trainer->set_on_log([L, ref](const train::LogRecord& rec) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    push_record(L, rec);
    protected_call(L, 1, 0);
  });
}

int tr_step(lua_State* L) {
  auto& lt = check_trainer(L, 1);
  const auto r = lt.trainer->step();
  lua_createtable(L, 0, 6);
  lua_pushinteger(L, r.iteration); lua_setfield(L, -2, "iteration");
  lua_pushnumber(L, r.loss); lua_setfield(L, -2, "loss");
  lua_pushnumber(L, r.grad_norm); lua_setfield(L, -2, "grad_norm");
  lua_pushnumber(L, r.lr); lua_setfield(L, -2, "lr");
  lua_pushnumber(L, r.ms); lua_setfield(L, -2, "ms");
  lua_pushboolean(L, r.skipped); lua_setfield(L, -2, "skipped");
  return 1;
}

int tr_run(lua_State* L) {
  auto& lt = check_trainer(L, 1);
  attach_hook(L, lt);
  const auto s = lt.trainer->run();
  lua_createtable(L, 0, 7);
  lua_pushinteger(L, s.iterations); lua_setfield(L, -2, "iterations");
  lua_pushnumber(L, s.first_loss); lua_setfield(L, -2, "first_loss");
  lua_pushnumber(L, s.last_loss); lua_setfield(L, -2, "last_loss");
  if (s.val_loss >= 0) { lua_pushnumber(L, s.val_loss); lua_setfield(L, -2, "val_loss"); }
  lua_pushnumber(L, s.tokens_per_s); lua_setfield(L, -2, "tokens_per_s");
  lua_pushinteger(L, s.skipped); lua_setfield(L, -2, "skipped");
  lua_pushstring(L, s.sample.c_str()); lua_setfield(L, -2, "sample");
  lua_createtable(L, static_cast<int>(s.losses.size()), 0);
  for (size_t i = 0; i < s.losses.size(); ++i) {
    lua_pushnumber(L, s.losses[i]);
    lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
  }
  lua_setfield(L, -2, "losses");
  return 1;
}

int tr_evaluate(lua_State* L) { lua_pushnumber(L, check_trainer(L, 1).trainer->evaluate()); return 1; }

int tr_sample(lua_State* L) {  // t:sample{prompt=, tokens=, top_k=, temperature=}
  auto& lt = check_trainer(L, 1);
  std::string prompt = "\n";
  int64_t tokens = 200, top_k = 5;
  double temperature = 1.0;
  if (lua_type(L, 2) == LUA_TTABLE) {
    prompt = field_string(L, 2, "prompt", "sample", prompt);
    tokens = field_integer(L, 2, "tokens", "sample", tokens);
    top_k = field_integer(L, 2, "top_k", "sample", top_k);
    temperature = field_number(L, 2, "temperature", "sample", temperature);
  } else if (!lua_isnoneornil(L, 2)) {
    prompt = check_string(L, 2);
  }
  lua_pushstring(L, lt.trainer->sample(prompt, tokens, top_k, temperature).c_str());
  return 1;
}

int tr_iteration(lua_State* L) { lua_pushinteger(L, check_trainer(L, 1).trainer->iteration()); return 1; }

int tr_model(lua_State* L) {
  auto& lt = check_trainer(L, 1);
  push_model(L, LuaModel{lt.trainer->model(), nullptr});  // shares the module
  return 1;
}

int tr_tostring(lua_State* L) {
  auto& lt = check_trainer(L, 1);
  const auto& s = lt.trainer->spec();
  lua_pushstring(L, cat("Trainer(", s.name, ": ", s.model.describe(), ", iteration ", lt.trainer->iteration(), "/",
                        lt.trainer->iters(), ", global batch ", lt.trainer->global_batch(), ", device ", s.device, ")").c_str());
  return 1;
}

}  // namespace

void open_train(lua_State* L, int core) {
  static const luaL_Reg methods[] = {{"step", wrapped<tr_step>}, {"run", wrapped<tr_run>},
                                     {"evaluate", wrapped<tr_evaluate>}, {"sample", wrapped<tr_sample>},
                                     {"iteration", wrapped<tr_iteration>}, {"model", wrapped<tr_model>},
                                     {nullptr, nullptr}};
  static const luaL_Reg metamethods[] = {{"__tostring", wrapped<tr_tostring>}, {nullptr, nullptr}};
  define_class<LuaTrainer>(L, kTrainerMeta, methods, metamethods);
  lua_pushvalue(L, core);
  lua_pushcfunction(L, wrapped<new_trainer>);
  lua_setfield(L, -2, "trainer");
  lua_pop(L, 1);
}

}  // namespace me::lua
