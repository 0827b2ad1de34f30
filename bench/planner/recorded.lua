-- The configurations whose speed bench/RESULTS.md records, as recipes for the planner's dry-run
-- estimate (bench/planner/recorded.sh sets the estimates beside the recorded figures):
--   ME_PLAN_MODEL=gpt1.3b megaengine --dry-run bench/planner/recorded.lua --world 1 --gpu h100-80gb [overrides]
local me = require "megaengine"
local models = {  -- bench/speed/megaengine_row.lua's, and the user's widths at 2 layers
  ["gpt1.3b"] = me.model.gpt { vocab = 50257, seq = 2048, layers = 24, hidden = 2048, heads = 16 },
  ["llama1b"] = me.model.llama { vocab = 32000, seq = 2048, layers = 22, hidden = 2048, heads = 32,
                                 query_groups = 4, ffn_hidden = 5632 },
  ["gpt39b-width"] = me.model.gpt { vocab = 50257, seq = 2048, layers = 2, hidden = 8192, heads = 64 },
  ["llama70b-width"] = me.model.llama { vocab = 32000, seq = 4096, layers = 2, hidden = 8192, heads = 64,
                                        query_groups = 8, ffn_multiplier = 1.3, ffn_multiple_of = 4096 },
}
local name = os.getenv "ME_PLAN_MODEL" or "gpt1.3b"
return me.recipe {
  name = "recorded-" .. name,
  device = "cuda",
  precision = "bf16",
  model = assert(models[name], "ME_PLAN_MODEL: gpt1.3b, llama1b, gpt39b-width or llama70b-width"),
  data = me.data.text { path = me.asset "moby-dick.txt" },
  batch = { micro = 4 },
  train = { iters = 10, eval_iters = 0 },
}
