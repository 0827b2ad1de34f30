// One source of recipe defaults (bindings/lua/fields.lua): the C++ sections declare none and
// read every field by name (visit_fields), so the two sides must list the same fields; the
// components' own options (the model config, comm::CommOptions, optim::OptimizerOptions) keep
// C++ defaults (the engine builds them without Lua too), so there the values must agree as well.
#include <catch2/catch.hpp>

extern "C" {
#include <lauxlib.h>
#include <lua.h>
}

#include <array>
#include <set>
#include <type_traits>
#include <sstream>

#include "bindings/lua/lua_host.h"
#include "bindings/lua/lua_recipe.h"
#include "engine/model/transformer_config.h"
#include "engine/config/recipe.h"

using me::lua::LuaHost;

namespace {

// The field names of fields.lua's section `name`, in order.
std::vector<std::string> lua_field_names(lua_State* L, const std::string& name) {
  std::string error;
  lua_getglobal(L, "require");
  lua_pushstring(L, "megaengine.fields");
  REQUIRE(lua_pcall(L, 1, 1, 0) == LUA_OK);
  REQUIRE(lua_getfield(L, -1, name.c_str()) == LUA_TTABLE);
  REQUIRE(lua_getfield(L, -1, "fields") == LUA_TTABLE);
  std::vector<std::string> names;
  for (lua_Integer i = 1; i <= static_cast<lua_Integer>(lua_rawlen(L, -1)); ++i) {
    lua_rawgeti(L, -1, i);
    lua_rawgeti(L, -1, 1);
    names.emplace_back(lua_tostring(L, -1));
    lua_pop(L, 2);
  }
  lua_pop(L, 3);
  return names;
}

struct NameCollector {
  std::vector<std::string> names;
  template <class T>
  void operator()(const char* name, T&) {
    names.emplace_back(name);
  }
};

template <class Section>
std::vector<std::string> cpp_field_names(Section section) {
  NameCollector c;
  visit_fields(section, c);
  return c.names;
}

// Every field of two configs as "name = value" lines, for a readable difference.
struct Printer {
  std::ostringstream out;
  template <class T>
  void operator()(const char* name, const T& v) {
    out << name << " =";
    if constexpr (std::is_same_v<T, std::array<double, 2>>) {
      out << " " << v[0] << " " << v[1] << "\n";
    } else {
      out << " " << v << "\n";
    }
  }
};
template <class Section>
std::string print(const Section& c) {
  Printer p;
  visit_fields(c, p);
  return p.out.str();
}

// me.model.<family>{} read by the recipe reader.
me::model::TransformerConfig lua_model_defaults(LuaHost& host, const std::string& family) {
  std::string error;
  REQUIRE(host.run_chunk("me = require 'megaengine'; model_defaults = me.model." + family + " {}", "=test", &error));
  lua_State* L = host.state();
  lua_getglobal(L, "model_defaults");
  me::model::TransformerConfig c;
  me::model::visit_fields(c, me::lua::FieldReader(L, lua_gettop(L), "model"));
  lua_pop(L, 1);
  return c;
}

}  // namespace

TEST_CASE("every recipe section lists the same fields in fields.lua and in C++", "[bindings][fields]") {
  LuaHost host;
  lua_State* L = host.state();
  using namespace me::config;
  CHECK(cpp_field_names(me::config::BatchSpec{}) == lua_field_names(L, "batch"));
  CHECK(cpp_field_names(me::config::ParallelSpec{}) == lua_field_names(L, "parallel"));
  CHECK(cpp_field_names(me::comm::CommOptions{}) == lua_field_names(L, "comm"));
  CHECK(cpp_field_names(me::config::TrainSpec{}) == lua_field_names(L, "train"));
  CHECK(cpp_field_names(me::config::SampleSpec{}) == lua_field_names(L, "sample"));
  CHECK(cpp_field_names(me::config::LogSpec{}) == lua_field_names(L, "log"));
  CHECK(cpp_field_names(me::config::CheckpointSpec{}) == lua_field_names(L, "checkpoint"));
  CHECK(cpp_field_names(me::config::ScheduleSpec{}) == lua_field_names(L, "schedule"));
  CHECK(cpp_field_names(me::model::TransformerConfig{}) == lua_field_names(L, "model"));
  me::optim::OptimizerOptions adamw, sgd;
  sgd.kind = "sgd";
  CHECK(cpp_field_names(adamw) == lua_field_names(L, "optimizer.adamw"));
  CHECK(cpp_field_names(sgd) == lua_field_names(L, "optimizer.sgd"));
  // The top level: its plain fields, then the sections that are tables of their own.
  me::config::Recipe run;
  NameCollector top;
  visit_top_fields(run, top);
  auto lua_top = lua_field_names(L, "recipe");
  lua_top.resize(top.names.size());
  CHECK(top.names == lua_top);
}

TEST_CASE("the model families' defaults in fields.lua equal TransformerConfig::gpt() and llama()",
          "[bindings][fields]") {
  LuaHost host;
  CHECK(print(lua_model_defaults(host, "gpt")) == print(me::model::TransformerConfig::gpt()));
  CHECK(print(lua_model_defaults(host, "llama")) == print(me::model::TransformerConfig::llama()));
}

TEST_CASE("the comm and optimizer defaults in fields.lua equal CommOptions{} and OptimizerOptions{}",
          "[bindings][fields]") {
  LuaHost host;
  std::string error;
  REQUIRE(host.run_chunk("me = require 'megaengine'; r = me.recipe { model = me.model.gpt{}, data = me.data.text{ path = 'x' } }",
                         "=test", &error));
  lua_State* L = host.state();
  lua_getglobal(L, "r");
  const auto recipe = me::lua::read_recipe(L, lua_gettop(L));
  lua_pop(L, 1);
  CHECK(print(recipe.comm) == print(me::comm::CommOptions{}));
  CHECK(print(recipe.optim) == print(me::optim::OptimizerOptions{}));
}

TEST_CASE("a recipe with a field missing is an error naming it, not a silent default", "[bindings][fields]") {
  LuaHost host;
  std::string error;
  REQUIRE(host.run_chunk("me = require 'megaengine'; r = me.recipe { model = me.model.gpt{}, data = me.data.text{ path = 'x' } }"
                         "; r.parallel.bucket_mb = nil",
                         "=test", &error));
  lua_State* L = host.state();
  lua_getglobal(L, "r");
  CHECK_THROWS_WITH(me::lua::read_recipe(L, lua_gettop(L)),
                    Catch::Contains("parallel.bucket_mb: expected a number, got nil"));
  lua_pop(L, 1);
}
