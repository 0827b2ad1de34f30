-- A runtime error inside a hook that the training loop calls: the traceback shows line 9.
local me = require "megaengine"
return me.recipe {
  model = me.model.gpt { layers = 1, hidden = 32, heads = 2, seq = 16 },
  data = me.data.text { path = me.asset "moby-dick.txt" },
  batch = { micro = 2 },
  train = { iters = 4, log_interval = 2, eval_iters = 0 },
  schedule = me.schedule.constant {},
  on_log = function(r) if r.iteration >= 2 then error("loss went the wrong way") end end,
}
