-- A recipe that forgot its `return` (issue 38, item 9): the run and the dry run must say so,
-- naming this file, instead of exiting 0 having done nothing.
local me = require "megaengine"
me.recipe {
  name = "no_return",
  model = me.model.gpt { vocab = 256, seq = 16, layers = 1, hidden = 32, heads = 2 },
  data = me.data.text { path = me.asset "moby-dick.txt" },
  train = { iters = 2 },
}
