// me.comm: the communicator, process groups and their collectives from Lua, so a person can
// poke at communication from the REPL under `megaengine --nproc 2`. Ranks are 0-based, as
// RANK and SLURM_PROCID are; tensor indices stay 1-based.
#include <torch/torch.h>

#include "bindings/lua/lua_tensor.h"
#include "bindings/lua/modules.h"
#include "engine/comm/communicator.h"
#include "engine/comm/gloo_group.h"
#include "engine/comm/nccl_group.h"
#include "engine/core/log.h"

#include <type_traits>

namespace me::lua {
namespace {

const char* const kCommKey = "me.comm.instance";
const char* const kGroupMeta = "me.ProcessGroup";
const char* const kWorkMeta = "me.Work";
const char* const kGridMeta = "me.ParallelGroups";

using GroupRef = std::shared_ptr<comm::ProcessGroup>;

// The communicator lives in the registry for the life of the Lua state; groups point into it.
comm::Communicator* find_comm(lua_State* L) {
  lua_getfield(L, LUA_REGISTRYINDEX, kCommKey);
  auto* c = static_cast<std::shared_ptr<comm::Communicator>*>(lua_touserdata(L, -1));
  lua_pop(L, 1);
  return c ? c->get() : nullptr;
}

// me.comm.init's table: the recipe's comm fields (comm::visit_fields, so a new field needs no
// line here), each optional, plus `device`.
comm::CommOptions read_options(lua_State* L, int t) {
  comm::CommOptions o;
  if (t == 0) return o;
  comm::visit_fields(o, [&](const char* name, auto& v) {
    using T = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<T, std::string>) v = field_string(L, t, name, "comm", v);
    else if constexpr (std::is_same_v<T, bool>) v = field_boolean(L, t, name, "comm", v);
    else if constexpr (std::is_integral_v<T>) v = field_integer(L, t, name, "comm", v);
    else v = field_number(L, t, name, "comm", v);
  });
  o.device = field_string(L, t, "device", "comm", o.device);
  o.check();  // the recipe's checks (comm_options.cpp), before anything connects
  return o;
}

comm::Communicator& get_comm(lua_State* L) {
  if (auto* c = find_comm(L)) return *c;
  auto env = launch::read_launch_env();
  push_object<std::shared_ptr<comm::Communicator>>(L, "me.Communicator",
                                                   std::make_shared<comm::Communicator>(env, comm::CommOptions{}));
  lua_setfield(L, LUA_REGISTRYINDEX, kCommKey);
  return *find_comm(L);
}

void push_group(lua_State* L, GroupRef g) {
  if (!g) {
    lua_pushnil(L);
    return;
  }
  push_object<GroupRef>(L, kGroupMeta, std::move(g));
}

GroupRef& check_group(lua_State* L, int arg) { return check_object<GroupRef>(L, arg, kGroupMeta, "process group"); }

int c_init(lua_State* L) {  // me.comm.init{ backend=, device=, timeout_s=, heartbeat_s=, dead_after_s= }
  ME_CHECK(find_comm(L) == nullptr, "me.comm.init: communication is already initialised in this process");
  const int t = lua_type(L, 1) == LUA_TTABLE ? 1 : 0;
  auto opts = read_options(L, t);
  auto env = launch::read_launch_env();
  push_object<std::shared_ptr<comm::Communicator>>(L, "me.Communicator", std::make_shared<comm::Communicator>(env, opts));
  lua_setfield(L, LUA_REGISTRYINDEX, kCommKey);
  push_group(L, find_comm(L)->world());
  return 1;
}

int c_world(lua_State* L) { push_group(L, get_comm(L).world()); return 1; }
int c_rank(lua_State* L) { lua_pushinteger(L, get_comm(L).rank()); return 1; }
int c_world_size(lua_State* L) { lua_pushinteger(L, get_comm(L).world_size()); return 1; }

int c_env(lua_State* L) {  // what the launcher told us, without initialising anything
  const auto e = launch::read_launch_env();
  lua_createtable(L, 0, 8);
  lua_pushinteger(L, e.rank); lua_setfield(L, -2, "rank");
  lua_pushinteger(L, e.world); lua_setfield(L, -2, "world");
  lua_pushinteger(L, e.local_rank); lua_setfield(L, -2, "local_rank");
  lua_pushinteger(L, e.local_world); lua_setfield(L, -2, "local_world");
  lua_pushstring(L, e.master_addr.c_str()); lua_setfield(L, -2, "master_addr");
  lua_pushinteger(L, e.master_port); lua_setfield(L, -2, "master_port");
  lua_pushstring(L, e.source.c_str()); lua_setfield(L, -2, "source");
  return 1;
}

int c_all_gather_object(lua_State* L) {
  const auto all = get_comm(L).all_gather_object(check_string(L, 1));
  lua_createtable(L, static_cast<int>(all.size()), 0);
  for (size_t i = 0; i < all.size(); ++i) {
    lua_pushlstring(L, all[i].data(), all[i].size());
    lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
  }
  return 1;
}

int c_new_group(lua_State* L) {  // me.comm.new_group(name, {ranks...})
  const auto name = check_string(L, 1);
  check_table(L, 2);
  std::vector<int> ranks;
  for (lua_Integer i = 1; i <= static_cast<lua_Integer>(lua_rawlen(L, 2)); ++i) {
    lua_rawgeti(L, 2, i);
    ranks.push_back(static_cast<int>(lua_tointeger(L, -1)));
    lua_pop(L, 1);
  }
  push_group(L, get_comm(L).new_group(name, ranks));
  return 1;
}

int c_grid(lua_State* L) {  // me.comm.grid{ tp=, pp=, cp= }
  check_table(L, 1);
  const int tp = static_cast<int>(field_integer(L, 1, "tp", "grid", 1));
  const int pp = static_cast<int>(field_integer(L, 1, "pp", "grid", 1));
  const int cp = static_cast<int>(field_integer(L, 1, "cp", "grid", 1));
  auto& c = get_comm(L);
  auto groups = comm::make_parallel_groups(c, tp, pp, cp);
  for (const auto& w : groups.warnings) log::warn(w);
  if (c.rank() == 0) log::info(groups.layout_table);
  lua_createtable(L, 0, 12);
  push_group(L, groups.tp); lua_setfield(L, -2, "tp");
  push_group(L, groups.pp); lua_setfield(L, -2, "pp");
  push_group(L, groups.dp); lua_setfield(L, -2, "dp");
  push_group(L, groups.cp); lua_setfield(L, -2, "cp");
  push_group(L, groups.model_parallel); lua_setfield(L, -2, "model_parallel");
  push_group(L, groups.embedding); lua_setfield(L, -2, "embedding");
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, groups.coords.tp); lua_setfield(L, -2, "tp");
  lua_pushinteger(L, groups.coords.pp); lua_setfield(L, -2, "pp");
  lua_pushinteger(L, groups.coords.dp); lua_setfield(L, -2, "dp");
  lua_pushinteger(L, groups.coords.cp); lua_setfield(L, -2, "cp");
  lua_setfield(L, -2, "coords");
  lua_pushinteger(L, groups.grid.layout().dp()); lua_setfield(L, -2, "dp_size");
  lua_pushstring(L, groups.layout_table.c_str()); lua_setfield(L, -2, "layout");
  luaL_setmetatable(L, kGridMeta);
  return 1;
}

// ---- ProcessGroup methods ----

// The trailing `async` flag: true returns a Work to wait on instead of blocking.
bool async_arg(lua_State* L, int arg) { return lua_toboolean(L, arg) != 0; }

int push_result(lua_State* L, const comm::WorkPtr& w, bool async, int tensor_arg) {
  if (async) {
    push_object<comm::WorkPtr>(L, kWorkMeta, w);
    return 1;
  }
  lua_pushvalue(L, tensor_arg);
  return 1;
}

comm::ReduceOp op_arg(lua_State* L, int arg) {
  return lua_isnoneornil(L, arg) ? comm::ReduceOp::sum : comm::parse_reduce_op(check_string(L, arg));
}

int g_all_reduce(lua_State* L) {  // g:all_reduce(t [, op [, async]]) -> t, reduced in place
  auto& g = check_group(L, 1);
  auto& t = check_tensor(L, 2);
  const bool async = async_arg(L, 4);
  return push_result(L, g->all_reduce(t, op_arg(L, 3), async), async, 2);
}

// g:all_gather(t [, out]) -> out, or a new tensor with size() x t.size(1) rows. `out` may hold
// `t` at this rank's place (in place, as the distributed optimizer gathers its parameters).
int g_all_gather(lua_State* L) {
  auto& g = check_group(L, 1);
  auto& in = check_tensor(L, 2);
  auto src = in.contiguous();
  if (!lua_isnoneornil(L, 3)) {
    auto& out = check_tensor(L, 3);
    g->all_gather(out, src);
    lua_settop(L, 3);
    return 1;
  }
  auto sizes = in.sizes().vec();
  if (sizes.empty()) sizes.push_back(1);
  sizes[0] *= g->size();
  auto out = torch::empty(sizes, in.options());
  g->all_gather(out, src);
  push_tensor(L, out);
  return 1;
}

// g:reduce_scatter(t [, op [, out]]) -> this rank's reduced chunk: `out` (which may be that chunk
// of `t` itself: in place, as gradient buckets are reduced), or a new tensor.
int g_reduce_scatter(lua_State* L) {
  auto& g = check_group(L, 1);
  auto in = check_tensor(L, 2).contiguous();
  if (!lua_isnoneornil(L, 4)) {
    auto& out = check_tensor(L, 4);
    g->reduce_scatter(out, in, op_arg(L, 3));
    lua_settop(L, 4);
    return 1;
  }
  ME_CHECK(in.dim() >= 1 && in.size(0) % g->size() == 0, "reduce_scatter: dimension 1 (", in.dim() ? in.size(0) : 0,
           ") must be divisible by the group size ", g->size());
  auto sizes = in.sizes().vec();
  sizes[0] /= g->size();
  auto out = torch::empty(sizes, in.options());
  g->reduce_scatter(out, in, op_arg(L, 3));
  push_tensor(L, out);
  return 1;
}

// g:empty_symmetric(n [, dtype = "float32"]) -> a 1-D tensor of n zeros in memory the group
// registers for direct access by every member (NCCL windows; a plain tensor under Gloo).
// Collective: every member calls it with the same size, in the same order.
int g_empty_symmetric(lua_State* L) {
  auto& g = check_group(L, 1);
  const auto n = check_integer(L, 2);
  ME_CHECK(n > 0, "empty_symmetric: the size must be positive, got ", n);
  auto t = g->empty_symmetric(n, torch::TensorOptions().dtype(check_dtype(L, 3, torch::kFloat)));
  push_tensor(L, t);
  return 1;
}

int g_broadcast(lua_State* L) {  // g:broadcast(t [, root=0]) -> t
  auto& g = check_group(L, 1);
  auto& t = check_tensor(L, 2);
  const int root = lua_isnoneornil(L, 3) ? 0 : static_cast<int>(check_integer(L, 3));
  g->broadcast(t, root);
  lua_settop(L, 2);
  return 1;
}

int g_send(lua_State* L) {
  auto& g = check_group(L, 1);
  g->send(check_tensor(L, 2), static_cast<int>(check_integer(L, 3)));
  return 0;
}

int g_recv(lua_State* L) {  // g:recv(t, src) -> t, filled
  auto& g = check_group(L, 1);
  auto& t = check_tensor(L, 2);
  g->recv(t, static_cast<int>(check_integer(L, 3)));
  lua_settop(L, 2);
  return 1;
}

int g_barrier(lua_State* L) { check_group(L, 1)->barrier(); return 0; }
int g_rank(lua_State* L) { lua_pushinteger(L, check_group(L, 1)->rank()); return 1; }
int g_size(lua_State* L) { lua_pushinteger(L, check_group(L, 1)->size()); return 1; }
int g_name(lua_State* L) { lua_pushstring(L, check_group(L, 1)->name().c_str()); return 1; }
int g_backend(lua_State* L) { lua_pushstring(L, check_group(L, 1)->backend().c_str()); return 1; }

int g_ranks(lua_State* L) {
  const auto& r = check_group(L, 1)->ranks();
  lua_createtable(L, static_cast<int>(r.size()), 0);
  for (size_t i = 0; i < r.size(); ++i) {
    lua_pushinteger(L, r[i]);
    lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
  }
  return 1;
}

int g_tostring(lua_State* L) { lua_pushstring(L, check_group(L, 1)->describe().c_str()); return 1; }

int w_wait(lua_State* L) { check_object<comm::WorkPtr>(L, 1, kWorkMeta, "work")->wait(); return 0; }
int w_done(lua_State* L) { lua_pushboolean(L, check_object<comm::WorkPtr>(L, 1, kWorkMeta, "work")->is_completed()); return 1; }
int w_tostring(lua_State* L) { lua_pushstring(L, "Work"); return 1; }

int grid_tostring(lua_State* L) {
  lua_getfield(L, 1, "layout");
  return 1;
}

int c_backends(lua_State* L) {
  lua_createtable(L, 0, 3);
  lua_pushboolean(L, comm::gloo_available()); lua_setfield(L, -2, "gloo");
  lua_pushboolean(L, comm::nccl_available()); lua_setfield(L, -2, "nccl");
  lua_pushstring(L, comm::nccl_version().c_str()); lua_setfield(L, -2, "nccl_version");
  return 1;
}

}  // namespace

void open_comm(lua_State* L, int core) {
  static const luaL_Reg group_methods[] = {
      {"all_reduce", wrapped<g_all_reduce>}, {"all_gather", wrapped<g_all_gather>},
      {"reduce_scatter", wrapped<g_reduce_scatter>}, {"broadcast", wrapped<g_broadcast>},
      {"empty_symmetric", wrapped<g_empty_symmetric>},
      {"send", wrapped<g_send>}, {"recv", wrapped<g_recv>}, {"barrier", wrapped<g_barrier>},
      {"rank", wrapped<g_rank>}, {"size", wrapped<g_size>}, {"name", wrapped<g_name>},
      {"backend", wrapped<g_backend>}, {"ranks", wrapped<g_ranks>}, {nullptr, nullptr}};
  static const luaL_Reg group_meta[] = {{"__tostring", wrapped<g_tostring>}, {nullptr, nullptr}};
  define_class<GroupRef>(L, kGroupMeta, group_methods, group_meta);
  static const luaL_Reg work_methods[] = {{"wait", wrapped<w_wait>}, {"is_completed", wrapped<w_done>}, {nullptr, nullptr}};
  static const luaL_Reg work_meta[] = {{"__tostring", wrapped<w_tostring>}, {nullptr, nullptr}};
  define_class<comm::WorkPtr>(L, kWorkMeta, work_methods, work_meta);
  static const luaL_Reg none[] = {{nullptr, nullptr}};
  define_class<std::shared_ptr<comm::Communicator>>(L, "me.Communicator", nullptr, none);
  luaL_newmetatable(L, kGridMeta);
  lua_pushcfunction(L, grid_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);

  static const luaL_Reg fns[] = {{"init", wrapped<c_init>}, {"world", wrapped<c_world>}, {"rank", wrapped<c_rank>},
                                 {"world_size", wrapped<c_world_size>}, {"env", wrapped<c_env>},
                                 {"all_gather_object", wrapped<c_all_gather_object>},
                                 {"new_group", wrapped<c_new_group>}, {"grid", wrapped<c_grid>},
                                 {"backends", wrapped<c_backends>}, {nullptr, nullptr}};
  lua_newtable(L);
  luaL_setfuncs(L, fns, 0);
  lua_setfield(L, core, "comm");
}

}  // namespace me::lua
