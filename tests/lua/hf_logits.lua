-- Logits of the equivalence model (tests/lua/train_parallel.lua; ME_EQUIV_MODEL=llama for LLaMA)
-- loaded from each of $ME_HF_LOADS (checkpoint.load values separated by ';': checkpoints of any
-- layout, Hugging Face imports, "hf:DIR") in one process at tp = 1, on the same tokens: all must
-- equal the first's exactly (ME_HF_TOLERANCE: a relative bound instead). ME_HF_OVERRIDES:
-- recipe overrides for every load (precision=bf16). Used by tests/cli/hf_roundtrip.sh.
local me = require "megaengine"
local loads, overrides = {}, {}
for p in (os.getenv("ME_HF_LOADS") or ""):gmatch("[^;]+") do loads[#loads + 1] = p end
for o in (os.getenv("ME_HF_OVERRIDES") or ""):gmatch("%S+") do overrides[#overrides + 1] = o end
assert(#loads >= 2, "set ME_HF_LOADS to two or more checkpoint.load values separated by ';'")
local tolerance = tonumber(os.getenv("ME_HF_TOLERANCE") or "0")
local here = arg[0]:match("^(.*)/[^/]*$") or "."

me.manual_seed(1234)
local tokens = me.tensor.randint(0, 256, { 2, 32 })
local first
for i, path in ipairs(loads) do
  local recipe = dofile(here .. "/train_parallel.lua")
  me.apply_overrides(recipe, overrides)
  recipe.checkpoint.load = path
  local trainer = me.trainer(recipe)
  -- The real vocabulary's columns: the padding's rows are not exported, an import keeps the
  -- model's own initial values there.
  local logits = trainer:model():full_logits(tokens):narrow(3, 1, recipe.model.vocab):to("float32")
  if i == 1 then
    first = logits
  else
    local diff = (logits - first):abs():max():item()
    local rel = diff / first:abs():max():item()
    print(("hf_logits: %s vs %s: max |difference| %.3g (relative %.3g)"):format(path, loads[1], diff, rel))
    assert(rel <= tolerance, ("logits from %s differ from %s's by %.3g relative (allowed %.3g)")
      :format(path, loads[1], rel, tolerance))
  end
end
print(("hf_logits: %d loads give the same logits"):format(#loads))
