-- A tiny GPT reading the .bin/.idx dataset at $ME_DATA_PREFIX (tests/cli/corrupt_data.sh
-- points it at damaged copies: each must be a clear error naming the file).
local me = require "megaengine"
return me.recipe {
  model = me.model.gpt { vocab = 50257, layers = 1, hidden = 32, heads = 2, seq = 16 },
  data = me.data.gpt { prefix = os.getenv("ME_DATA_PREFIX"), split = "90,10,0" },
  batch = { micro = 2 },
  train = { iters = 2, log_interval = 1, eval_iters = 1 },
}
