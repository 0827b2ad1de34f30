-- One rank (2, or ME_HUNG_RANK) hangs before a collective: past the 3 s timeout the others
-- fail, naming it. ME_TEST_DEVICE=cuda runs it over NCCL (the group's monitor thread).
local me = require "megaengine"
local device = os.getenv("ME_TEST_DEVICE") or "cpu"
local hung = tonumber(os.getenv("ME_HUNG_RANK") or 2)
local w = me.comm.init { timeout_s = 3, heartbeat_s = 0.5, device = device }
local t = me.tensor.ones { 3 }
if device ~= "cpu" then t = t:to("cuda:" .. me.comm.env().local_rank % me.cuda.device_count()) end
w:all_reduce(t)
if device ~= "cpu" then me.cuda.synchronize() end
if w:rank() == hung then os.execute("sleep 60.123") end
w:all_reduce(t)
if device ~= "cpu" then me.cuda.synchronize() end
