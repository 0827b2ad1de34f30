#pragma once
#include <string>

#include "bindings/lua_util.h"
#include "engine/model/gpt_config.h"

namespace me::lua {

// Reads a model table (what me.model.gpt{...} returns) at stack index t; `path` names it in
// messages. Validates: bad sizes are reported as "model.hidden must be ...".
model::GPTConfig read_gpt_config(lua_State* L, int t, const std::string& path);

}  // namespace me::lua
