// Pushing and reading tensors from Lua, for the binding files that pass tensors around.
#pragma once
#include <torch/torch.h>

#include "bindings/lua_util.h"

namespace me::lua {

void push_tensor(lua_State* L, torch::Tensor t);
torch::Tensor& check_tensor(lua_State* L, int arg);

}  // namespace me::lua
