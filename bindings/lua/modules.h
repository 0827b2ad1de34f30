// Each binding file adds its area's functions to the `core` table that the embedded Lua
// module (bindings/lua/megaengine.lua) wraps into `require "megaengine"`.
#pragma once
struct lua_State;

namespace me::lua {

void open_tensor(lua_State* L, int core);  // core.tensor.*, core.manual_seed, core.cuda_available
void open_model(lua_State* L, int core);   // core.gpt_check, core.gpt_parameters, core.build_model
void open_train(lua_State* L, int core);   // core.trainer
void open_comm(lua_State* L, int core);
void open_data(lua_State* L, int core);   // core.data.tokenizer, preprocess, loader
void open_dry_run(lua_State* L, int core);  // core.dry_run: the dry run's layout and memory report
void open_plan(lua_State* L, int core);     // core.plan, core.plan_layout: the layout planner
void open_hf(lua_State* L, int core);        // core.hf.*: Hugging Face export, import, config.json
void open_parallel(lua_State* L, int core);  // core.parallel.*, core.nn.*    // core.comm.*: communicator, groups, collectives

extern const char* const kTensorMeta;

}  // namespace me::lua
