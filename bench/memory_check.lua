-- The model bench/memory_check.sh measures: a GPT or LLaMA (ME_MC_FAMILY) of the size, batch,
-- precision, recomputation and layout its overrides give, on byte-level text (ME_MC_TEXT), for a
-- few iterations on the GPU. `megaengine --dry-run` on the same command line predicts its peak.
local me = require "megaengine"
local family = os.getenv "ME_MC_FAMILY" or "gpt"
local text = os.getenv "ME_MC_TEXT" or me.asset "moby-dick.txt"
local model = family == "llama"
  and me.model.llama { vocab = 32000, seq = 2048, layers = 4, hidden = 1024, heads = 16 }
  or me.model.gpt { vocab = 50257, seq = 2048, layers = 4, hidden = 1024, heads = 16 }
return me.recipe {
  name = "memory-check-" .. family,
  device = "cuda",
  precision = "bf16",
  model = model,
  data = me.data.text { path = text },
  batch = { micro = 4 },
  optimizer = me.optim.adamw { lr = 1e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 },
  schedule = me.schedule.constant {},
  train = { iters = 3, log_interval = 1, eval_iters = 0 },
  comm = { timeout_s = 300 },
}
