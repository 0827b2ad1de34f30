// me.parallel / me.nn: the pieces of tensor parallelism that are useful to call alone from
// Lua (tests, the REPL): vocabulary-parallel cross entropy next to the plain one.
#include <torch/torch.h>

#include "bindings/lua/lua_tensor.h"
#include "bindings/lua/modules.h"
#include "engine/parallel/layers.h"
#include "engine/parallel/mappings.h"

namespace me::lua {
namespace {

using GroupRef = std::shared_ptr<comm::ProcessGroup>;

parallel::TensorParallel tp_arg(lua_State* L, int arg) {
  parallel::TensorParallel tp;
  if (!lua_isnoneornil(L, arg)) tp.group = check_object<GroupRef>(L, arg, "me.ProcessGroup", "process group").get();
  return tp;
}

int64_t ignore_arg(lua_State* L, int arg) { return lua_isnoneornil(L, arg) ? -100 : check_integer(L, arg); }

// me.parallel.cross_entropy(local_logits [b,s,v/tp], labels [b,s] [, group [, ignore_index]])
int p_cross_entropy(lua_State* L) {
  push_tensor(L, parallel::vocab_parallel_cross_entropy(check_tensor(L, 1), check_tensor(L, 2), tp_arg(L, 3),
                                                        ignore_arg(L, 4)));
  return 1;
}

// me.parallel.shard(t, dim, group): this rank's slice of dimension dim (1-based) of t
int p_shard(lua_State* L) {
  auto& t = check_tensor(L, 1);
  const auto dim = check_integer(L, 2) - 1;
  auto tp = tp_arg(L, 3);
  push_tensor(L, parallel::slice_dim(t, dim, tp.rank(), tp.size()));
  return 1;
}

// me.nn.cross_entropy(logits [..., v], labels [...] [, ignore_index]): LibTorch's own, for reference
int nn_cross_entropy(lua_State* L) {
  auto& logits = check_tensor(L, 1);
  auto& labels = check_tensor(L, 2);
  namespace F = torch::nn::functional;
  push_tensor(L, F::cross_entropy(logits.reshape({-1, logits.size(-1)}), labels.reshape({-1}),
                                  F::CrossEntropyFuncOptions().ignore_index(ignore_arg(L, 3))));
  return 1;
}

}  // namespace

void open_parallel(lua_State* L, int core) {
  static const luaL_Reg par[] = {{"cross_entropy", wrapped<p_cross_entropy>}, {"shard", wrapped<p_shard>}, {nullptr, nullptr}};
  lua_newtable(L);
  luaL_setfuncs(L, par, 0);
  lua_setfield(L, core, "parallel");
  static const luaL_Reg nn[] = {{"cross_entropy", wrapped<nn_cross_entropy>}, {nullptr, nullptr}};
  lua_newtable(L);
  luaL_setfuncs(L, nn, 0);
  lua_setfield(L, core, "nn");
}

}  // namespace me::lua
