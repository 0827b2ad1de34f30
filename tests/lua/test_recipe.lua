-- Recipe construction, defaults, overrides and model printing from Lua.
local me = require "megaengine"

local function expect_error(fn, pattern)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error matching " .. pattern)
  assert(tostring(err):find(pattern, 1, true), ("error %q does not contain %q"):format(tostring(err), pattern))
end

local r = me.recipe {
  model = me.model.gpt { layers = 2, hidden = 64, heads = 4, seq = 32 },
  data = me.data.text { path = "x.txt" },
  train = { iters = 10 },
}
assert(me.is_recipe(r))
assert(r.train.iters == 10 and r.train.log_interval == 10, "defaults fill the rest of a section")
assert(r.optimizer.kind == "adamw" and r.schedule.kind == "cosine")
assert(r.model.ffn_hidden == 0 and r.model.vocab == 256)

me.apply_overrides(r, { "train.iters=50", "optimizer.lr=3e-4", "model.tie_embeddings=false", "name=x",
                        "optimizer.betas.2=0.99" })
assert(r.train.iters == 50 and math.type(r.train.iters) == "integer")
assert(r.optimizer.lr == 3e-4 and r.model.tie_embeddings == false and r.name == "x")
assert(r.optimizer.betas[2] == 0.99)
expect_error(function() me.apply_overrides(r, { "train.iters=1.5" }) end, "expects an integer, got '1.5'")
expect_error(function() me.apply_overrides(r, { "optimizer.lr=fast" }) end, "expects a number, got 'fast'")
expect_error(function() me.apply_overrides(r, { "model=3" }) end, "recipe.model is a table; set one of its fields")
expect_error(function() me.apply_overrides(r, { "train.iters.x=3" }) end, "recipe.train.iters is a number, not a table")
expect_error(function() me.apply_overrides(r, { "batch.mikro=3" }) end, "valid keys there: global, micro")

-- parameter counts: the formula and the built module agree
local spec = me.model.gpt { layers = 3, hidden = 48, heads = 6, seq = 20, vocab = 100 }
local model = spec:build(1)
assert(model:parameter_count() == spec:parameter_count())
local h, f, L, V, S = 48, 192, 3, 128, 20  -- vocab 100 padded to a multiple of 128
assert(spec:parameter_count() == V * h + S * h + L * (4 * h * h + 2 * h * f + 9 * h + f) + 2 * h)
local printed = tostring(model)
assert(printed:find("blocks") and printed:find("%(3x%)") and printed:find("in the model"), printed)

-- presets: the seed's GPT size table
local p39 = me.presets.gpt["39b"] {}
assert(p39.layers == 48 and p39.hidden == 8192 and p39.heads == 64)
local billions = p39:parameter_count() / 1e9
assert(math.abs(billions - 39.1) < 0.05, "gpt 39b preset has " .. billions .. "B parameters")
-- LLaMA-2: 70B within 0.5% of 68.98B, 7B of 6.74B, 13B of 13.0B
for name, expected in pairs { ["70b"] = 68.98e9, ["7b"] = 6.74e9, ["13b"] = 13.0e9 } do
  local n = me.presets.llama2[name]{}:parameter_count()
  assert(math.abs(n / expected - 1) < 0.005, ("llama2 %s preset has %d parameters"):format(name, n))
end
assert(me.presets.llama2["70b"]{}.query_groups == 8)

-- bad model sizes fail with the field named
expect_error(function() me.model.gpt { hidden = -4 } end, "model.hidden must be a positive integer, got -4")
expect_error(function() me.model.gpt { hidden = 30, heads = 4 } end, "model.hidden (30) must be divisible by model.heads (4)")
expect_error(function() me.model.gpt { layer = 2 } end, "me.model.gpt has no field 'layer'")

-- a forward pass from Lua
local tokens = me.tensor { { 1, 2, 3, 4 } }
local logits = model:forward(tokens)
assert(logits:size(1) == 1 and logits:size(2) == 4 and logits:size(3) == 128, "logits cover the padded vocabulary")
print(me.pretty(r))
print("test_recipe: all checks passed")
