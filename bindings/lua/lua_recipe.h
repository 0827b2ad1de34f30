// A recipe table (me.recipe{...}) into a config::Recipe. The Lua constructors have filled
// every field with its default (bindings/lua/fields.lua), so the C++ side reads values only:
// each section through its visit_fields, each field by name, a missing one an error.
#pragma once
#include <array>
#include <string>

#include "bindings/lua/lua_util.h"
#include "engine/config/recipe.h"

namespace me::lua {

// Reads the fields visit_fields names from the Lua table at absolute index `table`; `path`
// names the table in messages ("parallel.tp: expected an integer, got string 'x'").
class FieldReader {
 public:
  FieldReader(lua_State* L, int table, std::string path) : L_(L), t_(table), path_(std::move(path)) {}
  void operator()(const char* name, int64_t& v);
  void operator()(const char* name, double& v);
  void operator()(const char* name, bool& v);
  void operator()(const char* name, std::string& v);
  void operator()(const char* name, std::array<double, 2>& v);  // a pair such as optimizer.betas

 private:
  lua_State* L_;
  int t_;
  std::string path_;
};

// The recipe at absolute stack index r. No side effects (the log level is the caller's to apply).
config::Recipe read_recipe(lua_State* L, int r);

// Reads a data table (me.data.text{...} / me.data.gpt{...}) at stack index t.
config::DataSpec read_data_spec(lua_State* L, int t);

// The recipe's log level, applied (ME_LOG_LEVEL still wins).
void apply_log_spec(const config::LogSpec& spec);

}  // namespace me::lua
