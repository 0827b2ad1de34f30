-- The data file does not exist: the error names it.
local me = require "megaengine"
return me.recipe {
  model = me.model.gpt { layers = 1, hidden = 32, heads = 2, seq = 16 },
  data = me.data.text { path = "no/such/file.txt" },
}
