-- A small GPT trained on Moby Dick byte by byte (vocabulary 256, no tokenizer): the fastest
-- recipe, used by the tests. The default, recipes/gpt_tiny.lua, uses GPT-2 BPE. Fetch the text first: scripts/fetch_assets.sh
local me = require "megaengine"

return me.recipe {
  name = "gpt_tiny_bytes",
  device = "cpu",          -- device=cuda on a GPU machine
  seed = 1234,
  model = me.model.gpt { vocab = 256, seq = 128, layers = 4, hidden = 128, heads = 4 },
  data = me.data.text { path = me.asset "moby-dick.txt", holdout = 0.05 },
  batch = { micro = 16 },
  optimizer = me.optim.adamw { lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 },
  schedule = me.schedule.cosine { warmup_iters = 50, min_lr = 3e-4 },
  train = { iters = 700, log_interval = 50, eval_interval = 350, eval_iters = 20 },
  sample = { prompt = "Call me Ishmael. ", tokens = 300, top_k = 5, temperature = 0.8 },
}
