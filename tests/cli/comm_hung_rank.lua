-- Rank 2 hangs before a collective: past the 3 s timeout the others fail, naming rank 2.
local me = require "megaengine"
local w = me.comm.init { timeout_s = 3, heartbeat_s = 0.5 }
local t = me.tensor.ones { 3 }
w:all_reduce(t)
if w:rank() == 2 then os.execute("sleep 60.123") end
w:all_reduce(t)
