// The command-line override parser, me.apply_overrides in bindings/lua/megaengine.lua, run in
// a plain Lua 5.4 state on a recipe: each line of the input is one "key=value" argument.
// It must either apply them, keeping every field's type (an integer stays an integer), or
// raise one of its own messages ("override '...'", "unknown override key '...'"). Any other
// error (a Lua runtime error inside the module, a non-string error) is a finding.
//
// The Lua code is not compiled by clang, so libFuzzer would see no coverage in it: a line
// hook counts the Lua lines executed into libFuzzer's extra counters instead.
#include <lua.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

// libFuzzer reads this section as coverage, next to the compiler's own counters.
__attribute__((used, section("__libfuzzer_extra_counters"))) uint8_t g_lua_lines[4096];

void count_line(lua_State*, lua_Debug* ar) {
  uint8_t& c = g_lua_lines[static_cast<unsigned>(ar->currentline) % sizeof g_lua_lines];
  if (c < 255) ++c;
}

lua_State* g_L = nullptr;

// `core` stands in for the C++ half of the module: every member of it, at any depth, is an
// inert placeholder (callable, indexable), so loading the module touches nothing real.
// apply_overrides is pure Lua and never reaches it.
const char* kSetup = R"lua(
  local source_dir = ...
  local function inert()
    return setmetatable({}, { __index = function() return inert() end, __call = function() return nil end })
  end
  local core = inert()
  rawset(core, "version", "fuzz")
  rawset(core, "torch_version", "none")
  rawset(core, "source_dir", source_dir)
  -- The modules the binary embeds as "megaengine.NAME" are bindings/lua/NAME.lua here.
  table.insert(package.searchers, 2, function(name)
    local short = name:match("^megaengine%.([%w_]+)$")
    if not short then return nil end
    local path = source_dir .. "/bindings/lua/" .. short .. ".lua"
    local chunk, err = loadfile(path)
    if not chunk then return "\n\t" .. tostring(err) end
    return chunk, path
  end)
  local me = assert(loadfile(source_dir .. "/bindings/lua/megaengine.lua"))(core)
  package.loaded.megaengine = me
  local template = me.recipe {
    model = me.model.gpt { vocab = 256, seq = 64, layers = 2, hidden = 64, heads = 4 },
    data = me.data.text { path = "fuzz.txt" },
  }
  local function copy(t)
    if type(t) ~= "table" then return t end
    local out = {}
    for k, v in pairs(t) do out[k] = copy(v) end
    return setmetatable(out, getmetatable(t))
  end
  -- Every field keeps its Lua type; integer fields stay integers.
  local function same_types(a, b, path)
    for k, v in pairs(a) do
      local w = b[k]
      local where = path .. "." .. tostring(k)
      if type(v) ~= type(w) then return where .. " changed from a " .. type(v) .. " to a " .. type(w) end
      if math.type(v) == "integer" and math.type(w) ~= "integer" then return where .. " is no longer an integer" end
      if type(v) == "table" then
        local bad = same_types(v, w, where)
        if bad then return bad end
      end
    end
  end
  function fuzz_one(input)
    local list = {}
    for line in (input .. "\n"):gmatch("([^\n]*)\n") do list[#list + 1] = line end
    local recipe = copy(template)
    local ok, err = pcall(me.apply_overrides, recipe, list)
    if not ok then
      if type(err) ~= "string" then return "a " .. type(err) .. " was raised instead of a message" end
      if err:find("^override '") or err:find("^unknown override key '") then return nil end
      return "an error that is not the parser's own: " .. err
    end
    return same_types(template, recipe, "recipe")
  end
)lua";

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_L = luaL_newstate();
  luaL_openlibs(g_L);
  if (luaL_loadstring(g_L, kSetup) != LUA_OK) {
    std::fprintf(stderr, "fuzz_overrides: %s\n", lua_tostring(g_L, -1));
    std::abort();
  }
  lua_pushstring(g_L, ME_SOURCE_DIR);
  if (lua_pcall(g_L, 1, 0, 0) != LUA_OK) {
    std::fprintf(stderr, "fuzz_overrides: setting up the recipe failed: %s\n", lua_tostring(g_L, -1));
    std::abort();
  }
  lua_sethook(g_L, count_line, LUA_MASKLINE, 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // a command line, not a file
  lua_getglobal(g_L, "fuzz_one");
  lua_pushlstring(g_L, reinterpret_cast<const char*>(data), size);
  if (lua_pcall(g_L, 1, 1, 0) != LUA_OK) {
    std::fprintf(stderr, "fuzz_overrides: the harness failed: %s\n", lua_tostring(g_L, -1));
    std::abort();
  }
  if (!lua_isnil(g_L, -1)) {
    std::fprintf(stderr, "fuzz_overrides: %s\n", lua_tostring(g_L, -1));
    std::abort();
  }
  lua_pop(g_L, 1);
  lua_gc(g_L, LUA_GCSTEP, 0);
  return 0;
}
