-- A recipe with a syntax error on line 6: the message must name this file and line.
local me = require "megaengine"
return me.recipe {
  name = "bad",
  model = me.model.gpt { layers = 2 },
  train = { iters = = 5 },
}
