-- Dead-rank detection by heartbeat (comm.dead_after_s), under `megaengine --nproc 3`. The ranks
-- run "steps" (an all-reduce and a small matmul each); at step 12 the victim (ME_VICTIM, default
-- 1) has itself, from a background shell, after 0.3 s:
--   ME_FAULT=kill   SIGKILLed                 -> the job ends non-zero, naming it
--   ME_FAULT=stop   SIGSTOPped                -> the others' watchdogs see its heartbeat go
--                                                silent and end the job, naming it
--   ME_FAULT=slow   slowed by a sleep of ME_SLOW_S s (its heartbeat thread runs on)
--                                              -> nobody is killed; the job finishes
-- The collective timeout stays at its default (600 s): only the heartbeat rule can end it soon.
local me = require "megaengine"
local fault = os.getenv("ME_FAULT") or "stop"
local victim = tonumber(os.getenv("ME_VICTIM") or 1)
local dead_after = tonumber(os.getenv("ME_DEAD_AFTER") or 10)
local slow_s = tonumber(os.getenv("ME_SLOW_S") or 30)

local w = me.comm.init { heartbeat_s = 0.5, dead_after_s = dead_after }
local pid = io.open("/proc/self/stat"):read("n")  -- this rank's process id

local a = me.tensor.ones { 64, 64 }
local steps = tonumber(os.getenv("ME_STEPS") or 40)
local t0 = me.clock()
for step = 1, steps do
  -- Step 12: at least one heartbeat (every 0.5 s) has gone out since the first collective, so
  -- the others can name the victim's latest one.
  if step == 12 and w:rank() == victim then
    if fault == "slow" then
      os.execute("sleep " .. slow_s)
      print(("rank %d slept %d s and goes on"):format(w:rank(), slow_s))
    else
      local sig = fault == "kill" and "KILL" or "STOP"
      os.execute(("(sleep 0.3; kill -%s %d) &"):format(sig, pid))
    end
  end
  local t = a:matmul(a):sum():reshape { 1 }
  w:all_reduce(t)
  os.execute("sleep 0.05")
end
print(("rank %d: %d steps in %.1f s, test_dead_after passed"):format(w:rank(), steps, me.clock() - t0))
