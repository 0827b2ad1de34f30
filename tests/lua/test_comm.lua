-- Every collective and send/recv on real processes (megaengine --nproc N, N even), on float32
-- and bfloat16 tensors of odd sizes, checking values against closed forms. CPU (Gloo) by
-- default; ME_TEST_DEVICE=cuda runs the same checks over NCCL, one GPU per rank.
local me = require "megaengine"
local device = os.getenv("ME_TEST_DEVICE") or "cpu"
-- ME_TEST_NCCL_CTA_POLICY=zero: NCCL serves what it can on the copy engines (all-gathers into windows)
local w = me.comm.init { timeout_s = 60, device = device, nccl_cta_policy = os.getenv("ME_TEST_NCCL_CTA_POLICY") or "default" }
local r, n = w:rank(), w:size()
assert(n >= 2 and n % 2 == 0, "run me under --nproc N with N even")
local gpu = "cpu"
if device ~= "cpu" then gpu = "cuda:" .. (me.comm.env().local_rank % me.cuda.device_count()) end
-- every tensor below lives on this rank's device
local function D(t) return t:to(gpu) end
local sum_1_to_n = n * (n + 1) / 2
assert(me.comm.rank() == r and me.comm.world_size() == n)

local function check(cond, what)
  if not cond then error(("rank %d: %s"):format(r, what), 2) end
end

for _, dtype in ipairs { "float32", "bfloat16" } do
  local opts = { dtype = dtype }
  for _, size in ipairs { 1, 7, 13 } do
    -- all_reduce: each rank contributes (rank + 1) * (1..size)
    local base = me.tensor.arange(1, size + 1):to(dtype)
    local expect = base:to("float64")
    local function mine() return D((base * (r + 1)):to(dtype)) end
    local function host(t) return t:to("cpu"):to("float64") end
    local t = mine(); w:all_reduce(t, "sum")
    check(host(t):allclose(expect * sum_1_to_n), dtype .. " sum size " .. size)
    t = mine(); w:all_reduce(t, "max")
    check(host(t):allclose(expect * n), dtype .. " max")
    t = mine(); w:all_reduce(t, "min")
    check(host(t):allclose(expect), dtype .. " min")
    t = mine(); w:all_reduce(t, "avg")
    check(host(t):allclose(expect * (n + 1) / 2, 1e-2), dtype .. " avg")

    -- all_gather: row i of the result comes from rank i
    local g = w:all_gather(D(me.tensor.ones({ 1, size }, opts) * r))
    check(g:size(1) == n and g:size(2) == size, "all_gather shape")
    for i = 1, n do check(host(g[i]):sum():item() == (i - 1) * size, "all_gather row " .. i) end

    -- reduce_scatter: rank i keeps the reduced chunk i
    local full = me.tensor.arange(n * size):to(dtype):reshape { n, size }
    local chunk = w:reduce_scatter(D(full:clone()), "sum")
    check(chunk:size(1) == 1 and host(chunk[1]):allclose(full[r + 1]:to("float64") * n), dtype .. " reduce_scatter")

    -- broadcast from every root in turn
    for root = 0, n - 1 do
      local b = D(me.tensor.ones({ size }, opts) * (r == root and 7 or 0))
      w:broadcast(b, root)
      check(host(b):sum():item() == 7 * size, "broadcast from " .. root)
    end

    -- send/recv around a ring: even ranks send first, odd ranks receive first
    local right, left = (r + 1) % n, (r - 1) % n
    local got = D(me.tensor.zeros({ size }, opts))
    local out = D(me.tensor.ones({ size }, opts) * (r + 1))
    if r % 2 == 0 then w:send(out, right); w:recv(got, left) else w:recv(got, left); w:send(out, right) end
    check(host(got):sum():item() == (left + 1) * size, "ring recv")
  end
end

-- The distributed optimizer's pattern on memory the group registers (NCCL windows, a plain tensor
-- under Gloo): a flat buffer reduce-scattered in place, each rank keeping the average of its
-- piece, then all-gathered in place; small pieces and bucket-sized ones (1M elements a rank over
-- NCCL; under Gloo, whose path does not depend on the size (gloo_group.cpp), 256K: 4 ranks of
-- 1M on 2 CPU cores took 16 s of the test's 22).
me.manual_seed(11)  -- the same values on every rank
local function host64(t) return t:to("cpu"):to("float64") end
local bucket = device == "cpu" and (1 << 18) or (1 << 20)
for _, dtype in ipairs { "float32", "bfloat16" } do
  for _, m in ipairs { 3, bucket } do
    local what = ("%s, %d per rank, on a symmetric buffer"):format(dtype, m)
    local buf = w:empty_symmetric(n * m, dtype)
    check(buf:numel() == n * m and host64(buf):abs():sum():item() == 0, "empty_symmetric: zeros, " .. what)
    -- integers below 13 times (rank + 1): their average over ranks, (n + 1) / 2 x base, is exact in bf16
    local base = me.tensor.randint(0, 13, { n * m }):to("float64")
    buf:copy_(base * (r + 1))
    local piece = buf:narrow(1, r * m + 1, m)
    w:reduce_scatter(buf, "avg", piece)
    local want = base * ((n + 1) / 2)
    check(host64(piece):allclose(want:narrow(1, r * m + 1, m)), "in-place reduce_scatter, " .. what)
    w:all_gather(piece, buf)
    check(host64(buf):allclose(want), "in-place all_gather, " .. what)
  end
end

-- async handle
local t = D(me.tensor.ones { 5 })
local work = w:all_reduce(t, "sum", true)
work:wait()
check(t:to("cpu"):sum():item() == 5 * n, "async all_reduce")
if device ~= "cpu" then me.cuda.synchronize() end
check(work:is_completed(), "async work completed")
w:barrier()

-- host objects through the store
local names = me.comm.all_gather_object("rank-" .. r)
check(#names == n and names[n] == "rank-" .. (n - 1), "all_gather_object")

-- groups of a tp=2 grid in Megatron's order: tp pairs {0,1} {2,3}..., dp {0,2,...} {1,3,...}
local grid = me.comm.grid { tp = 2 }
check(grid.tp:size() == 2 and grid.dp:size() == n // 2 and grid.pp:size() == 1, "grid sizes")
local tpr = grid.tp:ranks()
check(tpr[1] == r - r % 2 and tpr[2] == r - r % 2 + 1, "tp group members")
local x = D(me.tensor { r })
grid.tp:all_reduce(x)
check(x:to("cpu"):item() == (r - r % 2) * 2 + 1, "tp all_reduce")
local y = D(me.tensor { r })
grid.dp:all_reduce(y)
local half = n // 2
check(y:to("cpu"):item() == half * (r % 2) + half * (half - 1), "dp all_reduce")
check(grid.coords.tp == r % 2 and grid.coords.dp == r // 2, "coords")

-- bad arguments are clear
local ok, err = pcall(function() w:send(D(me.tensor { 1 }), r) end)
check(not ok and tostring(err):find("must be another rank"), "send to self rejected: " .. tostring(err))
ok, err = pcall(function() me.comm.grid { tp = 3 } end)
check(not ok and tostring(err):find(("world size %d is not divisible by tp%%*pp%%*cp = 3"):format(n)), tostring(err))
w:barrier()
print(("rank %d: test_comm passed (%s, %s)"):format(r, w:backend(), gpu))
