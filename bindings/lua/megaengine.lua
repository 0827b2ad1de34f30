-- The Lua side of `require "megaengine"`: recipes are plain tables built by small
-- constructors that fill defaults and reject unknown fields; `core` is the C++ part
-- (tensors, models, the trainer). Embedded into the binary at build time.
local core = ...
local fields = require "megaengine.fields"
local me = { version = core.version, torch_version = core.torch_version, fields = fields }

---------------------------------------------------------------------------------------
-- helpers
---------------------------------------------------------------------------------------

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  return keys
end

-- Raises `msg` at the recipe line that called the public constructor (`level` counts
-- from the function calling `check_fields`).
local function check_fields(t, defaults, where, level)
  if type(t) ~= "table" then
    error(("%s: expected a table, got %s"):format(where, type(t)), level + 1)
  end
  for k in pairs(t) do
    if defaults[k] == nil then
      error(("%s has no field '%s'; valid fields: %s"):format(where, tostring(k),
        table.concat(sorted_keys(defaults), ", ")), level + 1)
    end
  end
end

-- A copy of `defaults` with `t`'s values on top (nested tables merged one level down).
local function with_defaults(t, defaults)
  local out = {}
  for k, v in pairs(defaults) do
    if type(v) == "table" and getmetatable(v) == nil then
      local copy = {}
      for k2, v2 in pairs(v) do copy[k2] = v2 end
      out[k] = copy
    else
      out[k] = v
    end
  end
  for k, v in pairs(t or {}) do out[k] = v end
  return out
end

-- help(): each constructor and the metatable of its specs -> its fields.lua section, recorded
-- where the constructor is made (from its defaults table), so the map cannot drift.
local help_sections = {}

-- A constructor: `me.x.name { fields }` -> a table of kind `kind` with its defaults.
local function constructor(kind, defaults, meta, check)
  local make = function(t)
    t = t or {}
    check_fields(t, defaults, kind, 2)
    local spec = with_defaults(t, defaults)
    if check then
      local ok, err = pcall(check, spec)
      if not ok then error(err, 2) end
    end
    return setmetatable(spec, meta)
  end
  help_sections[make] = fields.section_of(defaults)
  help_sections[meta] = help_sections[make]
  return make
end

---------------------------------------------------------------------------------------
-- pretty printing (the REPL prints every value through this)
---------------------------------------------------------------------------------------

local function is_identifier(s)
  return type(s) == "string" and s:match("^[%a_][%w_]*$") ~= nil
end

local function pretty(v, indent, seen)
  indent = indent or ""
  seen = seen or {}
  local tv = type(v)
  if tv == "string" then return ("%q"):format(v) end
  if tv ~= "table" then return tostring(v) end
  local mt = getmetatable(v)
  if mt and mt.__tostring and not mt.__pretty_fields then return tostring(v) end
  if seen[v] then return "<cycle>" end
  seen[v] = true
  local n = #v
  local keys = {}
  for k in pairs(v) do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local simple = #keys == 0
  for i = 1, n do simple = simple and type(v[i]) ~= "table" end
  if simple then  -- a short array prints on one line
    local parts = {}
    for i = 1, n do parts[i] = pretty(v[i], indent, seen) end
    seen[v] = nil
    return "{ " .. table.concat(parts, ", ") .. (n > 0 and " }" or "}")
  end
  local inner = indent .. "  "
  local lines = {}
  for i = 1, n do lines[#lines + 1] = inner .. pretty(v[i], inner, seen) .. "," end
  for _, k in ipairs(keys) do
    local key = is_identifier(k) and k or ("[" .. pretty(k, inner, seen) .. "]")
    lines[#lines + 1] = inner .. key .. " = " .. pretty(v[k], inner, seen) .. ","
  end
  seen[v] = nil
  local head = (mt and mt.__name) and (mt.__name .. " ") or ""
  return head .. "{\n" .. table.concat(lines, "\n") .. "\n" .. indent .. "}"
end
me.pretty = pretty

local function spec_meta(name)
  return { __name = name, __pretty_fields = true, __tostring = function(s) return pretty(s) end }
end

---------------------------------------------------------------------------------------
-- tensors, seeds, devices
---------------------------------------------------------------------------------------

me.tensor = setmetatable({}, {
  __index = core.tensor,
  __call = function(_, values, options) return core.tensor.from(values, options) end,
})
me.manual_seed = core.manual_seed
me.comm = core.comm
me.parallel = core.parallel  -- vocab-parallel cross entropy, shard()
me.nn = core.nn              -- reference ops (LibTorch cross entropy)
me.cuda = { is_available = core.cuda_available, device_count = core.cuda_device_count, device_name = core.cuda_device_name,
            synchronize = core.cuda_synchronize, memory = core.cuda_memory,
            reset_peak_memory = core.cuda_reset_peak_memory }
me.clock = core.clock  -- wall-clock seconds, for timing
-- The layout planner's measurements (bindings/lua/lua_plan.cpp; megaengine.calibrate uses them).
me.plan = { time_gemm = core.plan_time_gemm, time_attention = core.plan_time_attention, time_add = core.plan_time_add,
            write_profile = core.plan_write_profile }

function me.device(name)
  if name == "cpu" then return name end
  if type(name) == "string" and (name == "cuda" or name:match("^cuda:%d+$")) then
    if not core.cuda_available() then
      error(("device '%s': this build sees no CUDA GPU; use 'cpu'"):format(name), 2)
    end
    return name
  end
  error(("unknown device '%s': expected 'cpu', 'cuda' or 'cuda:N'"):format(tostring(name)), 2)
end

---------------------------------------------------------------------------------------
-- models
---------------------------------------------------------------------------------------

me.model = {}
local function model_meta(name)
  local meta = spec_meta(name)
  meta.__index = {
    -- :build(seed) or :build{ seed =, tp = grid.tp, sequence_parallel = true }
    build = function(self, opts) return core.build_model(self, opts) end,
    parameter_count = function(self, tp) return core.model_parameters(self, tp) end,
  }
  return meta
end

-- Every field of the engine's TransformerConfig, with each family's defaults (fields.lua), so
-- overrides (model.layers=2, model.recompute=full) can address any of them.
me.model.gpt = constructor("me.model.gpt", fields.defaults("model.gpt"), model_meta("gpt"), core.model_check)
me.model.llama = constructor("me.model.llama", fields.defaults("model.llama"), model_meta("llama"), core.model_check)

-- Presets: the GPT size table of the user's Megatron recipes and LLaMA-2's published sizes.
-- Each is callable with overrides: me.presets.gpt["39b"]{ seq = 2048 }.
local function preset(ctor, values)
  return setmetatable({}, {
    __call = function(_, extra)
      local t = {}
      for k, v in pairs(values) do t[k] = v end
      for k, v in pairs(extra or {}) do t[k] = v end
      return ctor(t)
    end,
    __index = values,
    __tostring = function() return pretty(values) end,
  })
end

local function gpt_size(heads, hidden, layers)
  -- GPT-2's vocabulary (50257); the model pads it to a multiple of 128 x tp as Megatron does.
  return preset(me.model.gpt, { heads = heads, hidden = hidden, layers = layers, seq = 2048, vocab = 50257 })
end
local function llama_size(layers, hidden, heads, extra)
  local t = { layers = layers, hidden = hidden, heads = heads, seq = 4096, vocab = 32000 }
  for k, v in pairs(extra or {}) do t[k] = v end
  return preset(me.model.llama, t)
end
me.presets = {
  gpt = {
    ["1.7b"] = gpt_size(24, 2304, 24), ["3.6b"] = gpt_size(32, 3072, 30),
    ["7.5b"] = gpt_size(32, 4096, 36), ["18.4b"] = gpt_size(48, 6144, 40),
    ["39.1b"] = gpt_size(64, 8192, 48), ["39b"] = gpt_size(64, 8192, 48),
    ["76.1b"] = gpt_size(80, 10240, 60), ["145.6b"] = gpt_size(96, 12288, 80),
    ["310.1b"] = gpt_size(128, 16384, 96),
    tiny = preset(me.model.gpt, { heads = 4, hidden = 128, layers = 4, seq = 128, vocab = 256 }),
  },
  llama2 = {
    ["7b"] = llama_size(32, 4096, 32),
    ["13b"] = llama_size(40, 5120, 40),
    ["70b"] = llama_size(80, 8192, 64, { query_groups = 8, ffn_multiplier = 1.3, ffn_multiple_of = 4096 }),
    tiny = llama_size(2, 64, 4, { seq = 64, vocab = 512, query_groups = 2, ffn_multiple_of = 32 }),
  },
}

---------------------------------------------------------------------------------------
-- data, optimizers, schedules
---------------------------------------------------------------------------------------

me.data = {}
me.data.text = constructor("me.data.text", fields.defaults("data.text"), spec_meta("data.text"),
  function(s)
    if type(s.path) ~= "string" or s.path == "" then error("me.data.text: 'path' (a text file) is required", 0) end
  end)

-- Megatron .bin/.idx data: one prefix, or a blend { {weight, prefix}, ... }. With `source`
-- (a text or jsonl file) rank 0 first preprocesses it into `prefix` when that is missing or older.
me.data.gpt = constructor("me.data.gpt", fields.defaults("data.gpt"), spec_meta("data.gpt"),
  function(s)
    if s.prefix == "" and #s.blend == 0 then
      error("me.data.gpt: give 'prefix' (a .bin/.idx prefix) or 'blend' = { {weight, prefix}, ... }", 0)
    end
    if s.prefix ~= "" and #s.blend > 0 then error("me.data.gpt: give either 'prefix' or 'blend', not both", 0) end
    if s.tokenizer == false then s.tokenizer = nil
    elseif getmetatable(s.tokenizer) == nil or s.tokenizer.kind == nil then
      error("me.data.gpt: 'tokenizer' must come from me.tokenizer.gpt2{} or me.tokenizer.sentencepiece{}", 0)
    end
    if s.source ~= "" and s.tokenizer == nil then
      error("me.data.gpt: 'source' is preprocessed with the recipe's tokenizer: add tokenizer = me.tokenizer.gpt2{}", 0)
    end
  end)

-- Tokenizers: GPT-2's byte-level BPE (encoder.json + vocab.bpe; by default the fetched assets)
-- and SentencePiece (a tokenizer.model).
me.tokenizer = {}
me.tokenizer.gpt2 = constructor("me.tokenizer.gpt2", fields.defaults("tokenizer.gpt2"),
  spec_meta("tokenizer.gpt2"),
  function(s)
    if s.vocab_file == "" then s.vocab_file = me.asset "gpt2-encoder.json" end
    if s.merge_file == "" then s.merge_file = me.asset "gpt2-vocab.bpe" end
  end)
me.tokenizer.sentencepiece = constructor("me.tokenizer.sentencepiece", fields.defaults("tokenizer.sentencepiece"),
  spec_meta("tokenizer.sentencepiece"),
  function(s)
    if s.model_file == "" then error("me.tokenizer.sentencepiece: 'model_file' (a tokenizer.model) is required", 0) end
  end)

-- A loaded tokenizer: tok:encode(text) -> ids, tok:decode(ids) -> text, tok:vocab_size(), tok:eod().
function me.tokenizer.load(spec) return core.data.tokenizer(spec) end

-- jsonl or text -> output.bin/.idx (what `megaengine preprocess` does), e.g.
-- me.data.preprocess{ input = "a.jsonl", output = "a_text_document", tokenizer = me.tokenizer.gpt2{} }
me.data.preprocess = core.data.preprocess
-- The training loader on its own: me.data.loader(me.data.gpt{...}, { seq, micro, iters, dp, dp_rank,
-- accumulation, consumed_samples, seed, builder, split ("train" | "valid" | "test") });
-- loader:next() -> tokens, labels, first sample.
me.data.loader = core.data.loader

-- Finds a file fetched by scripts/fetch_assets.sh.
function me.asset(name)
  local dirs = {}
  if os.getenv("ME_ASSET_DIR") then dirs[#dirs + 1] = os.getenv("ME_ASSET_DIR") end
  dirs[#dirs + 1] = core.source_dir .. "/assets"
  dirs[#dirs + 1] = "assets"
  for _, d in ipairs(dirs) do
    local path = d .. "/" .. name
    local f = io.open(path, "rb")
    if f then f:close(); return path end
  end
  error(("asset '%s' not found (looked in %s): run scripts/fetch_assets.sh, or set ME_ASSET_DIR")
    :format(name, table.concat(dirs, ", ")), 2)
end

me.optim = {}
me.optim.adamw = constructor("me.optim.adamw", fields.defaults("optimizer.adamw"), spec_meta("optim.adamw"))
me.optim.sgd = constructor("me.optim.sgd", fields.defaults("optimizer.sgd"), spec_meta("optim.sgd"))

me.schedule = {}
-- Counted in iterations, or in samples as Megatron's --lr-warmup-samples/--lr-decay-samples
-- (any *_samples field > 0 switches the schedule to samples).
for kind, section in pairs(fields.schedule_kinds) do
  me.schedule[kind] = constructor("me.schedule." .. kind, fields.defaults(section.name), spec_meta("schedule." .. kind))
end

---------------------------------------------------------------------------------------
-- recipes
---------------------------------------------------------------------------------------

local Recipe = spec_meta("recipe")
-- Recipes made but never looked at (me.is_recipe, me.trainer, overrides): a recipe file that
-- returns nothing but left one here forgot its `return` (me._run_file).
local unused_recipes = {}
local recipe_defaults = fields.defaults("recipe")  -- model, data, optimizer, schedule filled below
local section_names = fields.recipe_sections
for _, name in ipairs(section_names) do recipe_defaults[name] = fields.defaults(name) end

function me.recipe(t)
  check_fields(t, recipe_defaults, "recipe", 2)
  if t.parallel == "auto" then t.parallel = { auto = true } end  -- the planner chooses the layout at start
  for _, name in ipairs(section_names) do
    if t[name] ~= nil then check_fields(t[name], recipe_defaults[name], "recipe." .. name, 2) end
  end
  if t.model == nil then error("recipe.model is required: e.g. model = me.model.gpt{ layers = 4, hidden = 128 }", 2) end
  if t.data == nil then error("recipe.data is required: e.g. data = me.data.text{ path = me.asset 'moby-dick.txt' }", 2) end
  if getmetatable(t.model) == nil or t.model.kind == nil then
    error("recipe.model must come from me.model.gpt{...} or me.model.llama{...}", 2)
  end
  if getmetatable(t.data) == nil or t.data.kind == nil then
    error("recipe.data must come from me.data.gpt{...} or me.data.text{...}", 2)
  end
  local r = with_defaults(t, recipe_defaults)
  for _, name in ipairs(section_names) do r[name] = with_defaults(t[name], recipe_defaults[name]) end
  r.optimizer = t.optimizer or me.optim.adamw {}
  r.schedule = t.schedule or me.schedule.cosine {}
  if r.on_log and type(r.on_log) ~= "function" then error("recipe.on_log must be a function", 2) end
  setmetatable(r, Recipe)
  unused_recipes[r] = true
  return r
end

function me.is_recipe(t)
  unused_recipes[t] = nil  -- looked at: a script's recipe, not one a recipe file forgot to return
  return getmetatable(t) == Recipe
end
help_sections[me.recipe] = fields.section_of(recipe_defaults)
help_sections[Recipe] = help_sections[me.recipe]

-- help(x): a constructor's fields with defaults and help, a section by name ("parallel"), an
-- object's methods (bindings/lua/help.lua). The REPL makes it the global `help`.
function me.help_text(...)
  return require("megaengine.help").text(me, help_sections, (...), select("#", ...) > 0)
end
function me.help(...) print(me.help_text(...)) end

-- Applies "a.b.c=value" strings to a recipe. The type of the value comes from the field
-- it replaces; an unknown path lists the valid keys at the level where it went wrong.
-- Why `text` (an override's key, or a whole argument) is not a key: the first byte that is not
-- an ASCII letter, digit, '_' or '.' (a look-alike letter, a non-ASCII '=' pasted from a document).
local function bad_key_char(text)
  local at = text:find("[^%w_%.=]")
  if not at then return nil end
  local char = text:match("^[\xC0-\xF7][\x80-\xBF]*", at) or text:sub(at, at)
  return ("'%s' at byte %d is not an ASCII letter, digit, '_' or '.'%s"):format(char, at,
    char:byte() >= 128 and " (a non-ASCII character that looks like one?)" or "")
end
me._bad_key_char = bad_key_char

function me.apply_overrides(recipe, list)
  unused_recipes[recipe] = nil
  for _, item in ipairs(list) do
    local path, text = item:match("^([%w_%.]+)=(.*)$")
    local key = item:match("^([^=]+)=")
    if not path and key and bad_key_char(key) then
      error(("override '%s': in the key '%s', %s"):format(item, key, bad_key_char(key)), 0)
    end
    if not path then
      error(("override '%s' is not of the form key=value (e.g. train.iters=50)"):format(item), 0)
    end
    local t, prefix = recipe, "recipe"
    local parts = {}
    for part in path:gmatch("[^%.]+") do parts[#parts + 1] = part end
    for i, part in ipairs(parts) do
      local key = part
      if type(t) == "table" and t[key] == nil and tonumber(part) then key = math.tointeger(tonumber(part)) or key end
      local old = nil
      if type(t) == "table" then old = t[key] end
      if old == nil then
        local valid = {}
        for _, k in ipairs(sorted_keys(t)) do
          if type(t[k]) ~= "function" then valid[#valid + 1] = k end
        end
        error(("unknown override key '%s': %s has no field '%s'; valid keys there: %s")
          :format(path, prefix, part, table.concat(valid, ", ")), 0)
      end
      if i < #parts then
        if type(old) ~= "table" then
          error(("override '%s': %s.%s is a %s, not a table"):format(item, prefix, part, type(old)), 0)
        end
        t, prefix = old, prefix .. "." .. part
      else
        local value
        if math.type(old) == "integer" then
          value = math.tointeger(tonumber(text))
          if value == nil then
            error(("override '%s': %s.%s expects an integer, got '%s'"):format(item, prefix, part, text), 0)
          end
        elseif type(old) == "number" then
          value = tonumber(text)
          if value == nil then
            error(("override '%s': %s.%s expects a number, got '%s'"):format(item, prefix, part, text), 0)
          end
        elseif type(old) == "boolean" then
          if text == "true" then value = true elseif text == "false" then value = false
          else error(("override '%s': %s.%s expects true or false, got '%s'"):format(item, prefix, part, text), 0) end
        elseif type(old) == "string" then
          value = text
        elseif type(old) == "table" then
          error(("override '%s': %s.%s is a table; set one of its fields: %s"):format(item, prefix, part,
            table.concat(sorted_keys(old), ", ")), 0)
        else
          error(("override '%s': %s.%s is a %s and cannot be set from the command line"):format(item, prefix,
            part, type(old)), 0)
        end
        t[key] = value
      end
    end
  end
  return recipe
end

-- parallel.auto: the layout planner's best layout (engine/plan/layout_search.h) for the GPUs
-- `where` describes ({} in a run: the job's ranks; the dry run: {world=, gpus_per_node=}),
-- written into the recipe before anything reads its layout. Rank 0 logs the choice.
local function resolve_auto_layout(recipe, where)
  local c = core.plan_layout(recipe, where)
  local p = recipe.parallel
  p.tp, p.pp, p.sequence_parallel, p.distributed_optimizer = c.tp, c.pp, c.sequence_parallel, c.distributed_optimizer
  p.pp_first_layers, p.pp_last_layers = 0, 0
  recipe.model.recompute = c.recompute
  if c.recompute == "full" then recipe.model.recompute_every = 1 end
  recipe.batch.micro, recipe.batch.global = c.micro, c.global
  if (tonumber(os.getenv "RANK") or 0) == 0 then
    print(("parallel.auto: %s on %d node%s x %d GPUs (profile %s: estimated step %.2f s, %.1f GB per GPU; megaengine plan shows the ranking)")
      :format(c.description, c.nodes, c.nodes == 1 and "" or "s", c.gpus_per_node, c.profile, c.step_s, c.memory_gb))
  end
  return c
end

function me.trainer(recipe)
  if not me.is_recipe(recipe) then recipe = me.recipe(recipe) end
  unused_recipes[recipe] = nil
  if recipe.parallel.auto then resolve_auto_layout(recipe, {}) end
  return core.trainer(recipe)
end

function me.train(recipe) return me.trainer(recipe):run() end

-- Hugging Face transformers: me.hf.export(trainer or checkpoint dir, out [, {dtype=, force=}])
-- writes a model directory (a trainer is saved as a checkpoint first, every rank calling);
-- me.hf.import(hf_dir, out [, model]) a checkpoint; me.hf.config(model) shows config.json;
-- me.hf.save_tensors(path, {name = tensor}) writes a safetensors file (for Python to compare).
me.hf = { import = core.hf.import, config = core.hf.config, save_tensors = core.hf.save_tensors }
function me.hf.export(src, out, opts)
  if type(src) == "string" then return core.hf.export_dir(src, out, opts) end
  return core.hf.export_saved(function(dir) src:save(dir) end, out, opts)
end

-- `return me.recipe { ... }` is a tail call: Lua keeps no line of the recipe for errors the
-- constructors raise, so they point into this module. Put the recipe's file and the line
-- of the offending field in front instead.
local function locate_in_recipe(msg, path)
  local rest = msg:match("^%[megaengine%]:%d+: (.*)$")
  if not rest then
    if msg:match("^[^\n]-:%d+: ") then return msg end  -- already names a file and line
    rest = msg
  end
  rest = rest:gsub("\nstack traceback:\n%s*%(%.%.%.tail calls%.%.%.%)", "")
  local field = rest:match("has no field '([%w_]+)'")
  local f = field and io.open(path, "r")
  if f then
    local n = 0
    for line in f:lines() do
      n = n + 1
      if line:find("%f[%w_]" .. field .. "%s*=") then f:close(); return ("%s:%d: %s"):format(path, n, rest) end
    end
    f:close()
  end
  return ("%s: %s"):format(path, rest)
end

-- `megaengine FILE [args]`: runs FILE; if it returns a recipe, applies the key=value
-- arguments to it and trains (or, with dry_run, prints it). Returns recipe, trainer, summary.
function me._run_file(path, args, opts)
  local f = io.open(path, "r")
  if not f then
    error(("cannot open recipe '%s': no such file or not readable (recipes live in recipes/, e.g. recipes/gpt_tiny.lua)")
      :format(path), 0)
  end
  f:close()
  local chunk, err = loadfile(path)
  if not chunk then error(err, 0) end
  for r in pairs(unused_recipes) do unused_recipes[r] = nil end
  local out = table.pack(xpcall(chunk, core.traceback, table.unpack(args)))
  local ok, result = out[1], out[2]
  if not ok then error(locate_in_recipe(tostring(result), path), 0) end
  local overrides = {}
  for _, a in ipairs(args) do
    if a:find("=", 1, true) then overrides[#overrides + 1] = a end
  end
  if result == nil then
    -- A script (a test, a tool) returns nothing and trains itself; a recipe file that made a
    -- recipe and returned nothing forgot its `return`, and a dry run or overrides need one.
    local forgot = out.n == 1 and next(unused_recipes) ~= nil
    if forgot or opts.dry_run or #overrides > 0 then
      error(("%s returned nothing%s: end it with `return me.recipe { ... }`"):format(path,
        forgot and " (it made a recipe and dropped it)" or opts.dry_run and ", so --dry-run has no recipe to check"
        or ", so the overrides cannot apply"), 0)
    end
    return nil
  end
  if type(result) ~= "table" then
    error(("%s returned a %s; a recipe file ends with `return me.recipe { ... }`"):format(path, type(result)), 0)
  end
  for _, a in ipairs(args) do
    if not a:find("=", 1, true) then
      local why = bad_key_char(a)
      error(("argument '%s' is not an override of the form key=value (e.g. train.iters=50)%s"):format(a,
        why and "; " .. why or ""), 0)
    end
  end
  local recipe = me.is_recipe(result) and result or me.recipe(result)
  me.apply_overrides(recipe, overrides)
  if opts.plan then
    -- `megaengine plan`: every layout ranked (bindings/lua/lua_plan.cpp); nothing runs.
    print(core.plan(recipe, opts))
    return recipe
  end
  if opts.dry_run and recipe.parallel.auto then
    opts.world = opts.world or opts.gpus_per_node
    resolve_auto_layout(recipe, { world = opts.world or opts.gpus_per_node, gpus_per_node = opts.gpus_per_node,
                                  gpu_memory = opts.gpu_memory, gpu = opts.gpu, profile = opts.profile })
  end
  if opts.dry_run then
    -- The run's checks, then the layout of opts.world GPUs, the iterations, parameters per
    -- stage, memory per GPU and the verdict (bindings/lua/lua_dry_run.cpp): shapes only, no weights, no
    -- data. Made before anything is printed: a recipe the run would refuse prints only why.
    local report = core.dry_run(recipe, opts)
    print(pretty(recipe))
    print(("model parameters: %d"):format(recipe.model:parameter_count(recipe.parallel.tp)))
    print(report)
    return recipe
  end
  local trainer = me.trainer(recipe)
  return recipe, trainer, trainer:run()
end

return me
