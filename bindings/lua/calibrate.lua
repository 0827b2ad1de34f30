-- `megaengine plan --calibrate OUT.json` (docs/planner.md): measures this machine for the layout
-- planner's profile (engine/plan/device_profile.h) and writes it:
--   - the dense GEMM peak (8192^3 on a GPU) and the GEMM rate by smallest dimension;
--   - causal fused attention, forward + backward, by sequence length (head_dim 128);
--   - elementwise bandwidth (out = a + b);
--   - under --nproc N, all-gather, reduce-scatter, all-reduce and send/recv by message size over
--     the N ranks of this node (the intra-node link), checked for the right values first.
-- What one node cannot measure alone (the inter-node link) and what only whole training steps
-- show (how much TP and DP traffic the GEMMs hide: tp_exposed, dp_exposed) come from a base
-- profile, and the written profile's "source" says which fields did.
--   megaengine plan --calibrate h100.json                 (one GPU; the links from the base)
--   megaengine --nproc 8 plan --calibrate h100.json       (one node: the intra-node link too)
local me = require "megaengine"
local M = {}

-- The sizes a calibration visits: a GPU's, or a CPU's (small, for tests: seconds, not minutes).
local sizes = {
  cuda = { peak = 8192, big = 8192, dims = { 128, 256, 512, 1024, 2048, 4096, 8192 }, seqs = { 512, 1024, 2048, 4096, 8192 },
           heads = 16, head_dim = 128, tokens = 16384, add = 1 << 27, bytes = { 1e6, 4e6, 16e6, 64e6, 256e6, 1e9 }, iters = 10 },
  cpu = { peak = 256, big = 256, dims = { 16, 64, 256 }, seqs = { 64, 128 }, heads = 2, head_dim = 32, tokens = 256,
          add = 1 << 20, bytes = { 4e4, 4e5 }, iters = 3 },
}

local function sorted_curve(points)
  table.sort(points, function(a, b) return a[1] < b[1] end)
  return points
end

-- opts: out (path), device ("cuda" | "cpu"; default: cuda when there is one), base (a built-in
-- profile's name or a file), name, gpu_memory_gb, quick (fewer sizes)
function M.run(opts)
  local device = opts.device or (me.cuda.is_available() and "cuda" or "cpu")
  local s = assert(sizes[device == "cpu" and "cpu" or "cuda"])
  local env = me.comm.env()
  local world = env.world or 1
  local gpu = device ~= "cpu" and env.local_rank % me.cuda.device_count() or nil
  local dev = gpu and ("cuda:" .. gpu) or "cpu"
  local rank0 = env.rank == 0
  local function say(...) if rank0 then print(string.format(...)) end end

  local measured = { name = opts.name or ("calibrated-" .. device), memory_gb = opts.gpu_memory_gb }
  -- dense peak, then each smallest dimension against it
  local n = s.peak
  local peak = 2 * n ^ 3 / me.plan.time_gemm(n, n, n, dev, s.iters) / 1e12
  local rates = {}
  for i, d in ipairs(s.dims) do
    rates[i] = 2 * d * s.big * s.big / me.plan.time_gemm(d, s.big, s.big, dev, s.iters) / 1e12
    peak = math.max(peak, rates[i])  -- the peak is the best rate seen (a first run can be slow)
  end
  measured.matmul_tflops = peak
  say("calibrate: %s, dense GEMM peak %.4g TFLOP/s", dev, peak)
  measured.gemm_efficiency = {}
  for i, d in ipairs(s.dims) do
    measured.gemm_efficiency[i] = { d, rates[i] / peak }
    say("calibrate: GEMM %dx%dx%d: %.2f of the peak", d, s.big, s.big, rates[i] / peak)
  end
  measured.attention_tflops = {}
  for _, seq in ipairs(s.seqs) do
    local batch = math.max(1, s.tokens // seq)
    local t = me.plan.time_attention(batch, s.heads, seq, s.head_dim, dev, s.iters)
    -- causal: each query attends to seq / 2 keys; QK^T and PV 2 FLOPs each; backward 2.5x forward
    local flops = 3.5 * 2 * 2 * batch * seq * (seq / 2) * s.heads * s.head_dim
    measured.attention_tflops[#measured.attention_tflops + 1] = { seq, flops / t / 1e12 }
    say("calibrate: causal attention, seq %d: %.4g TFLOP/s forward + backward", seq, flops / t / 1e12)
  end
  local elem = device == "cpu" and 4 or 2
  measured.memory_gbps = 3 * s.add * elem / me.plan.time_add(s.add, dev, s.iters) / 1e9
  say("calibrate: out = a + b over %d elements: %.0f GB/s", s.add, measured.memory_gbps)

  local from_base = "inter_node, tp_exposed, dp_exposed" .. (opts.gpu_memory_gb and "" or ", memory_gb")
  if world > 1 then
    measured.intra_node = M.collectives(device, dev, s, say)
  else
    from_base = "intra_node, " .. from_base
  end
  local gpu_name = gpu and me.cuda.device_name(gpu) or ""
  measured.gpu = opts.gpu_name or (gpu_name ~= "" and gpu_name) or dev
  measured.source = ("megaengine plan --calibrate on %s, %d rank%s, %s; from the base profile %s: %s"):format(
    dev, world, world == 1 and "" or "s", os.date("!%Y-%m-%d"), opts.base, from_base)
  if rank0 then
    me.plan.write_profile(measured, opts.out, opts.base)
    print(("calibrate: wrote %s (%s)"):format(opts.out, measured.source))
  end
  return measured
end

-- The collectives that --calibrate and bench/comm_bandwidth.lua time, over communicator w with
-- tensors on `dev`, by name: factor (nccl-tests' bus bandwidth = bytes x factor / time) and
-- make(count), which checks one call's values on `count` float32 elements and returns the call to
-- time. send/recv pairs ranks (0, 1), (2, 3), ...; an odd last rank idles.
function M.collective_cases(w, dev)
  local r, n = w:rank(), w:size()
  local function ones(count, value) return me.tensor.ones({ count }, { device = dev }) * value end
  local function check(ok, what) if not ok then error(("rank %d: wrong result in %s"):format(r, what), 0) end end
  return {
    all_reduce = { factor = 2 * (n - 1) / n, make = function(count)
      local t = ones(count, r + 1)
      w:all_reduce(t, "sum")
      check(t:to("cpu")[1]:item() == n * (n + 1) / 2, "all_reduce")
      return function() w:all_reduce(t, "sum") end
    end },
    all_gather = { factor = (n - 1) / n, make = function(count)
      local part = ones(count // n, r)
      check(w:all_gather(part):to("cpu")[count // n * n]:item() == n - 1, "all_gather")
      return function() w:all_gather(part) end
    end },
    reduce_scatter = { factor = (n - 1) / n, make = function(count)
      local t = ones(count // n * n, 1)
      check(w:reduce_scatter(t, "sum"):to("cpu")[1]:item() == n, "reduce_scatter")
      return function() w:reduce_scatter(t, "sum") end
    end },
    sendrecv = { factor = 1, make = function(count)
      local t = ones(count, r)
      local peer = r % 2 == 0 and r + 1 or r - 1
      local function step()
        if peer >= n then return end
        if r % 2 == 0 then w:send(t, peer) else w:recv(t, peer) end
      end
      step()
      if r % 2 == 1 then check(t:to("cpu")[1]:item() == r - 1, "sendrecv") end
      return step
    end },
  }
end

-- Bus bandwidth (GB/s, nccl-tests' convention) of each collective by message bytes over every
-- rank, all on one node: the profile's intra_node link.
function M.collectives(device, dev, s, say)
  local w = me.comm.init { device = device, timeout_s = 300 }
  local n = w:size()
  local function sync() if device ~= "cpu" then me.cuda.synchronize() end end
  local function timed(fn)
    fn(); fn()
    sync(); w:barrier()
    local t0 = me.clock()
    for _ = 1, s.iters do fn() end
    sync()
    local t = me.tensor.ones({ 1 }, { device = dev }) * ((me.clock() - t0) / s.iters)
    w:all_reduce(t, "max")  -- the slowest rank's time
    return t:to("cpu"):item()
  end
  local all = M.collective_cases(w, dev)
  local cases = { all_gather_gbps = all.all_gather, reduce_scatter_gbps = all.reduce_scatter,
                  all_reduce_gbps = all.all_reduce, send_recv_gbps = all.sendrecv }
  local order = { "all_gather_gbps", "reduce_scatter_gbps", "all_reduce_gbps", "send_recv_gbps" }  -- the same on every rank
  -- NCCL connects each kind of collective at its first call (1.9 GB/s for the first 1 MB case on
  -- 4 x H100 without this): every case runs once at the largest size before any is timed
  for _, name in ipairs(order) do
    cases[name].make(math.floor(s.bytes[#s.bytes] / 4))()
  end
  sync()
  local link = { latency_us = 0 }
  for _, name in ipairs(order) do
    link[name] = {}
    for _, bytes in ipairs(s.bytes) do
      local count = math.floor(bytes / 4)
      local seconds = timed(cases[name].make(count))
      local busbw = count * 4 * cases[name].factor / seconds / 1e9
      link[name][#link[name] + 1] = { count * 4, busbw }
      say("calibrate: %s over %d ranks, %d bytes: %.1f GB/s", (name:gsub("_gbps", "")), n, count * 4, busbw)
    end
    sorted_curve(link[name])
  end
  -- latency: the smallest all-reduce's time
  link.latency_us = timed(cases.all_reduce_gbps.make(1)) * 1e6
  say("calibrate: a 4-byte all-reduce: %.1f us", link.latency_us)
  return link
end

return M
