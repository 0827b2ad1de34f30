#pragma once
#include <torch/torch.h>

#include <memory>
#include <string>

#include "bindings/lua/lua_util.h"
#include "engine/comm/process_group.h"
#include "engine/model/transformer.h"
#include "engine/config/recipe.h"

namespace me::lua {

extern const char* const kModelMeta;

// A built model as Lua holds it; keeps its tensor-parallel group alive.
struct LuaModel {
  model::Transformer module{nullptr};
  std::shared_ptr<comm::ProcessGroup> group;
};

// Reads a model table (what me.model.gpt{...} / me.model.llama{...} return, every field filled)
// at stack index t; `path` names it in messages. Validates.
model::TransformerConfig read_model_config(lua_State* L, int t, const std::string& path);

void push_model(lua_State* L, LuaModel m);

// Reads a tokenizer table (me.tokenizer.gpt2{...} / sentencepiece{...}) at stack index t;
// `path` names it in messages.
data::TokenizerSpec read_tokenizer_spec(lua_State* L, int t, const std::string& path);

}  // namespace me::lua
