#include "bindings/lua/lua_recipe.h"

#include "bindings/lua/lua_model.h"
#include "engine/core/log.h"

namespace me::lua {

void FieldReader::operator()(const char* name, int64_t& v) { v = field_integer(L_, t_, name, path_); }
void FieldReader::operator()(const char* name, double& v) { v = field_number(L_, t_, name, path_); }
void FieldReader::operator()(const char* name, bool& v) { v = field_boolean(L_, t_, name, path_); }
void FieldReader::operator()(const char* name, std::string& v) { v = field_string(L_, t_, name, path_); }

void FieldReader::operator()(const char* name, std::array<double, 2>& v) {
  const bool table = push_field_table(L_, t_, name, path_);
  ME_CHECK(table && lua_rawlen(L_, -1) == 2, path_, ".", name, ": expected two numbers {a, b}, got ",
           table ? std::to_string(lua_rawlen(L_, -1)) + " values" : std::string("nil"));
  for (int i = 1; i <= 2; ++i) {
    lua_rawgeti(L_, -1, i);
    ME_CHECK(lua_type(L_, -1) == LUA_TNUMBER, path_, ".", name, "[", i, "]: expected a number, got ",
             luaL_typename(L_, -1));
    v[static_cast<size_t>(i - 1)] = lua_tonumber(L_, -1);
    lua_pop(L_, 1);
  }
  lua_pop(L_, 1);
}

namespace {

// data.blend = { {weight, prefix}, ... }: an array, read by index.
void read_blend(lua_State* L, int t, config::DataSpec& d) {
  if (!push_field_table(L, t, "blend", "data")) return;
  const int b = lua_gettop(L);
  const auto n = static_cast<int>(lua_rawlen(L, b));
  for (int i = 1; i <= n; ++i) {
    lua_rawgeti(L, b, i);
    double w = 0;
    std::string p;
    if (lua_istable(L, -1) && lua_rawlen(L, -1) == 2) {
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

}  // namespace

config::DataSpec read_data_spec(lua_State* L, int t) {
  config::DataSpec d;
  FieldReader read(L, t, "data");
  read("kind", d.kind);
  if (d.kind == "text") {
    read("path", d.path);
    read("holdout", d.holdout);
    return d;
  }
  ME_CHECK(d.kind == "gpt", "data.kind '", d.kind, "' is unknown: use me.data.text{} or me.data.gpt{}");
  std::string prefix;
  read("prefix", prefix);
  if (!prefix.empty()) d.blend.emplace_back(1.0, prefix);
  const size_t from_prefix = d.blend.size();
  read_blend(L, t, d);
  d.blend_given = d.blend.size() > from_prefix;
  ME_CHECK(!d.blend.empty(), "me.data.gpt: give data.prefix (a .bin/.idx prefix) or data.blend = { {weight, prefix}, ... }");
  ME_CHECK(from_prefix == 0 || d.blend.size() == 1, "me.data.gpt: give either data.prefix or data.blend, not both");
  read("split", d.split);
  read("cache_dir", d.cache_dir);
  read("eod_mask_loss", d.eod_mask_loss);
  read("source", d.source);
  read("source_format", d.source_format);
  read("json_key", d.json_key);
  ME_CHECK(d.source.empty() || d.blend.size() == 1, "data.source needs a single data.prefix to preprocess into");
  if (push_field_table(L, t, "tokenizer", "data")) {
    d.tokenizer = read_tokenizer_spec(L, lua_gettop(L), "data.tokenizer");
    lua_pop(L, 1);
  }
  return d;
}

namespace {

// Pushes recipe[name], which the recipe constructor made a table.
int push_section(lua_State* L, int r, const char* name) {
  ME_CHECK(push_field_table(L, r, name, "recipe"), "recipe.", name,
           " is missing: build the recipe with me.recipe{...}, which fills every section");
  return lua_gettop(L);
}

}  // namespace

config::Recipe read_recipe(lua_State* L, int r) {
  config::Recipe s;
  config::visit_top_fields(s, FieldReader(L, r, "recipe"));
  s.model = read_model_config(L, push_section(L, r, "model"), "model");
  lua_pop(L, 1);
  s.data = read_data_spec(L, push_section(L, r, "data"));
  lua_pop(L, 1);
  config::visit_sections(s, [&](const char* name, auto& section) {
    visit_fields(section, FieldReader(L, push_section(L, r, name), name));
    lua_pop(L, 1);
  });
  return s;
}

void apply_log_spec(const config::LogSpec& spec) {
  log::set_level(log::parse_level(spec.level));
  log::init_from_env();  // ME_LOG_LEVEL still wins over the recipe
}

}  // namespace me::lua
