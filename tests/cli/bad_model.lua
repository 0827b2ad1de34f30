-- A zero size in the model table (line 7): the message names the field and the line.
local me = require "megaengine"
return me.recipe {
  name = "bad_model",
  data = me.data.text { path = me.asset "moby-dick.txt" },
  -- the constructor checks its sizes where it is called:
  model = me.model.gpt { layers = 2, hidden = 0, heads = 2 },
}
