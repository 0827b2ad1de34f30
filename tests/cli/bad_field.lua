-- A misspelt field (line 5): the message lists the valid ones.
local me = require "megaengine"
return me.recipe {
  model = me.model.gpt { layers = 2 },
  data = me.data.text { path = me.asset "moby-dick.txt" }, train = { iter = 5 },
}
