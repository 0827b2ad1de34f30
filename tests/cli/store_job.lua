-- A job that waits to be probed (tests/cli/store_token.sh): rank 0 writes the store's port
-- (and, for the test's control probe, the job token) into ME_STORE_TEST_DIR, then every rank
-- waits for the file "probed" before its collectives. It must finish normally.
local me = require "megaengine"
local dir = assert(os.getenv("ME_STORE_TEST_DIR"), "set ME_STORE_TEST_DIR")
local w = me.comm.init { timeout_s = 120 }
local t = me.tensor.ones { 3 }
w:all_reduce(t)
if w:rank() == 0 then
  local f = assert(io.open(dir .. "/token", "w")); f:write(os.getenv("ME_JOB_TOKEN")); f:close()
  f = assert(io.open(dir .. "/port.tmp", "w")); f:write(me.comm.env().master_port); f:close()
  os.rename(dir .. "/port.tmp", dir .. "/port")
end
for _ = 1, 600 do
  local f = io.open(dir .. "/probed")
  if f then f:close(); break end
  os.execute("sleep 0.1")
end
w:all_reduce(t)
assert(t:sum():item() == 3 * 4, "the all-reduce after the probes went wrong")
print(("rank %d: test_store_job passed"):format(w:rank()))
