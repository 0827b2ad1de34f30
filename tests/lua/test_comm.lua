-- Every collective and send/recv on 4 real processes (run under megaengine --nproc 4), on
-- float32 and bfloat16 tensors of odd sizes, checking values against closed forms.
local me = require "megaengine"
local w = me.comm.init { timeout_s = 60 }
local r, n = w:rank(), w:size()
assert(n == 4, "run me under --nproc 4")
assert(me.comm.rank() == r and me.comm.world_size() == n)

local function check(cond, what)
  if not cond then error(("rank %d: %s"):format(r, what), 2) end
end

for _, dtype in ipairs { "float32", "bfloat16" } do
  local opts = { dtype = dtype }
  for _, size in ipairs { 1, 7, 13 } do
    -- all_reduce: each rank contributes (rank + 1) * (1..size)
    local base = me.tensor.arange(1, size + 1):to(dtype)
    local function mine() return (base * (r + 1)):to(dtype) end
    local t = mine(); w:all_reduce(t, "sum")
    check(t:to("float64"):allclose(base:to("float64") * 10), dtype .. " sum size " .. size)
    t = mine(); w:all_reduce(t, "max")
    check(t:to("float64"):allclose(base:to("float64") * 4), dtype .. " max")
    t = mine(); w:all_reduce(t, "min")
    check(t:to("float64"):allclose(base:to("float64")), dtype .. " min")
    t = mine(); w:all_reduce(t, "avg")
    check(t:to("float64"):allclose(base:to("float64") * 2.5, 1e-2), dtype .. " avg")

    -- all_gather: row i of the result comes from rank i
    local g = w:all_gather(me.tensor.ones({ 1, size }, opts) * r)
    check(g:size(1) == n and g:size(2) == size, "all_gather shape")
    for i = 1, n do check(g[i]:to("float64"):sum():item() == (i - 1) * size, "all_gather row " .. i) end

    -- reduce_scatter: rank i keeps the reduced chunk i
    local full = me.tensor.arange(n * size):to(dtype):reshape { n, size }
    local chunk = w:reduce_scatter(full:clone(), "sum")
    check(chunk:size(1) == 1 and chunk[1]:to("float64"):allclose(full[r + 1]:to("float64") * n), dtype .. " reduce_scatter")

    -- broadcast from every root in turn
    for root = 0, n - 1 do
      local b = me.tensor.ones({ size }, opts) * (r == root and 7 or 0)
      w:broadcast(b, root)
      check(b:to("float64"):sum():item() == 7 * size, "broadcast from " .. root)
    end

    -- send/recv around a ring: even ranks send first, odd ranks receive first
    local right, left = (r + 1) % n, (r - 1) % n
    local got = me.tensor.zeros({ size }, opts)
    local out = me.tensor.ones({ size }, opts) * (r + 1)
    if r % 2 == 0 then w:send(out, right); w:recv(got, left) else w:recv(got, left); w:send(out, right) end
    check(got:to("float64"):sum():item() == (left + 1) * size, "ring recv")
  end
end

-- async handle
local t = me.tensor.ones { 5 }
local work = w:all_reduce(t, "sum", true)
work:wait()
check(work:is_completed() and t:sum():item() == 20, "async all_reduce")
w:barrier()

-- host objects through the store
local names = me.comm.all_gather_object("rank-" .. r)
check(#names == n and names[4] == "rank-3", "all_gather_object")

-- groups of a 2 x 2 grid in Megatron's order: tp pairs {0,1} {2,3}, dp pairs {0,2} {1,3}
local grid = me.comm.grid { tp = 2 }
check(grid.tp:size() == 2 and grid.dp:size() == 2 and grid.pp:size() == 1, "grid sizes")
local tpr = grid.tp:ranks()
check(tpr[1] == r - r % 2 and tpr[2] == r - r % 2 + 1, "tp group members")
local x = me.tensor { r }
grid.tp:all_reduce(x)
check(x:item() == (r - r % 2) * 2 + 1, "tp all_reduce")
local y = me.tensor { r }
grid.dp:all_reduce(y)
check(y:item() == (r % 2) * 2 + 2, "dp all_reduce")
check(grid.coords.tp == r % 2 and grid.coords.dp == r // 2, "coords")

-- bad arguments are clear
local ok, err = pcall(function() w:send(me.tensor { 1 }, r) end)
check(not ok and tostring(err):find("must be another rank"), "send to self rejected: " .. tostring(err))
ok, err = pcall(function() me.comm.grid { tp = 3 } end)
check(not ok and tostring(err):find("world size 4 is not divisible by tp%*pp%*cp = 3"), tostring(err))
w:barrier()
print(("rank %d: test_comm passed"):format(r))
