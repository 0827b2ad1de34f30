-- Collective bandwidth, printed the way nccl-tests prints it: for each collective and message
-- size, the time per call, the algorithm bandwidth (bytes / time) and the bus bandwidth (what
-- each link carries, comparable across GPU counts: all_reduce x 2(n-1)/n, all_gather and
-- reduce_scatter x (n-1)/n, broadcast and send/recv x 1). Every size is checked for the
-- right values before it is timed.
--   megaengine --nproc 2 bench/comm_bandwidth.lua              (one GPU per rank, NCCL)
--   ME_BENCH_DEVICE=cpu megaengine --nproc 4 bench/comm_bandwidth.lua   (Gloo, small sizes)
-- ME_BENCH_COLLECTIVES=all_gather,all_gather_sym picks cases (the _sym ones run in place in a
-- registered window); ME_BENCH_NCCL_CTA_POLICY=zero sets the communicator's CTA policy
-- (all_gather_sym then runs on the copy engines).
local me = require "megaengine"
local device = os.getenv("ME_BENCH_DEVICE") or "cuda"
local w = me.comm.init { device = device, timeout_s = 300,
                         nccl_cta_policy = os.getenv("ME_BENCH_NCCL_CTA_POLICY") or "default" }
local r, n = w:rank(), w:size()
local gpu = device == "cpu" and "cpu" or ("cuda:" .. me.comm.env().local_rank % me.cuda.device_count())
local max_bytes = tonumber(os.getenv("ME_BENCH_MAX_BYTES") or (device == "cpu" and 2 ^ 22 or 2 ^ 30))
local iters, warmup = tonumber(os.getenv("ME_BENCH_ITERS") or 20), 5

local function sync() if device ~= "cpu" then me.cuda.synchronize() end end
local function timed(fn)
  for _ = 1, warmup do fn() end
  sync(); w:barrier()
  local t0 = me.clock()
  for _ = 1, iters do fn() end
  sync()
  return (me.clock() - t0) / iters
end
local function ones(count, value) return (me.tensor.ones({ count }, { device = gpu }) * value) end
local function expect(cond, what)
  if not cond then error(("rank %d: wrong result in %s"):format(r, what)) end
end

-- all_reduce, all_gather, reduce_scatter and sendrecv as `megaengine plan --calibrate` times them
-- (bindings/lua/calibrate.lua); the in-place and broadcast cases are this benchmark's own.
local shared = require("megaengine.calibrate").collective_cases(w, gpu)
local function shared_case(name) return { name = name, factor = shared[name].factor, run = shared[name].make } end
local cases = {
  shared_case "all_reduce",
  shared_case "all_gather",
  { name = "all_gather_sym", factor = (n - 1) / n, run = function(count)
      -- in place in memory the group registers (an NCCL window), as the distributed optimizer gathers
      local each = count // n
      local buf = w:empty_symmetric(each * n)
      local part = buf:narrow(1, r * each + 1, each)
      part:copy_(ones(each, r))
      w:all_gather(part, buf)
      expect(buf:to("cpu")[each * n]:item() == n - 1, "all_gather_sym")
      return function() w:all_gather(part, buf) end
    end },
  shared_case "reduce_scatter",
  { name = "reduce_scatter_sym", factor = (n - 1) / n, run = function(count)
      -- in place in a registered window, as the column layers' input gradients are reduce-scattered
      -- with parallel.tp_symmetric_mb (the sums grow with each timed call: harmless)
      local each = count // n
      local buf = w:empty_symmetric(each * n)
      buf:copy_(ones(each * n, 1))
      local mine = buf:narrow(1, r * each + 1, each)
      w:reduce_scatter(buf, "sum", mine)
      expect(mine:to("cpu")[each]:item() == n, "reduce_scatter_sym")
      return function() w:reduce_scatter(buf, "sum", mine) end
    end },
  { name = "broadcast", factor = 1, run = function(count)
      local t = ones(count, r == 0 and 3 or 0)
      w:broadcast(t, 0)
      expect(t:to("cpu")[count]:item() == 3, "broadcast")
      return function() w:broadcast(t, 0) end
    end },
  shared_case "sendrecv",
}

if r == 0 then
  print(("# megaengine collective bandwidth: %d ranks, backend %s, float32, %d iterations after %d warm-up"):format(
    n, w:backend(), iters, warmup))
  print(("# %-14s %12s %12s %10s %9s %9s"):format("collective", "size (B)", "count", "time (us)", "algbw", "busbw"))
  print(("# %-14s %12s %12s %10s %9s %9s"):format("", "", "(elements)", "", "(GB/s)", "(GB/s)"))
end
local picked = os.getenv("ME_BENCH_COLLECTIVES")
for _, case in ipairs(cases) do
  if picked and not ("," .. picked .. ","):find("," .. case.name .. ",", 1, true) then goto next_case end
  local bytes = 1024
  while bytes <= max_bytes do
    local count = bytes // 4
    local fn = case.run(count)
    local seconds = timed(fn)
    if r == 0 then
      local algbw = bytes / seconds / 1e9
      print(("  %-14s %12d %12d %10.1f %9.2f %9.2f"):format(case.name, bytes, count, seconds * 1e6, algbw,
        algbw * case.factor))
    end
    bytes = bytes * 4
  end
  ::next_case::
end
if r == 0 then print("# all sizes checked for correct values before timing") end
