-- A runtime error inside a function the recipe calls (line 6, called from line 10): the
-- message must show the recipe's line and a traceback through the recipe.
local me = require "megaengine"

local function layers_for(size)
  return size.layers * 2  -- size is nil: attempt to index a nil value
end

return me.recipe {
  model = me.model.gpt { layers = layers_for(nil) },
  data = me.data.text { path = me.asset "moby-dick.txt" },
}
