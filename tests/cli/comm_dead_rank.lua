-- Rank 2 exits in the middle of the job: the launcher names it and stops the others.
local me = require "megaengine"
local w = me.comm.init { timeout_s = 20, heartbeat_s = 0.5 }
local t = me.tensor.ones { 3 }
w:all_reduce(t)
if w:rank() == 2 then os.exit(3) end
w:all_reduce(t)
w:all_reduce(t)
