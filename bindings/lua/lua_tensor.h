// Pushing and reading tensors from Lua, for the binding files that pass tensors around.
#pragma once
#include <torch/torch.h>

#include "bindings/lua/lua_util.h"

namespace me::lua {

void push_tensor(lua_State* L, torch::Tensor t);
torch::Tensor& check_tensor(lua_State* L, int arg);
// A dtype name at arg ("float32", "bfloat16", ...), or `fallback` when the argument is absent.
torch::ScalarType check_dtype(lua_State* L, int arg, torch::ScalarType fallback);

}  // namespace me::lua
