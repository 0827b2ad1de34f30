-- Tensor bindings as a REPL user meets them. Any failed check exits non-zero.
local me = require "megaengine"

local function expect_error(fn, pattern)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error matching " .. pattern)
  assert(tostring(err):find(pattern), ("error %q does not match %q"):format(tostring(err), pattern))
end

me.manual_seed(7)
local a = me.tensor.randn { 2, 3 }
assert(a:dim() == 2 and a:size(1) == 2 and a:size(2) == 3 and a:numel() == 6)
assert(a:dtype() == "float32" and a:device() == "cpu")
local shape = a:shape()
assert(#shape == 2 and shape[1] == 2 and shape[2] == 3)
me.manual_seed(7)
assert(me.tensor.randn(2, 3) == a, "manual_seed makes randn repeatable, varargs sizes == table sizes")

local m = me.tensor { { 1, 2 }, { 3, 4 } }
assert(m:dtype() == "int64", "integer tables give int64")
local f = me.tensor { { 1.0, 2.0 }, { 3.0, 4.5 } }
assert(f:dtype() == "float32")
assert((m + 1):sum():item() == 14)
assert((2 * m):sum():item() == 20)
assert((m - m):abs():sum():item() == 0)
assert((-m):sum():item() == -10)
assert(math.abs((f / 2):sum():item() - 5.25) < 1e-6)
assert((m ^ 2):sum():item() == 30)
assert(m:matmul(m) == me.tensor { { 7, 10 }, { 15, 22 } })
assert(m:t() == me.tensor { { 1, 3 }, { 2, 4 } })
assert(me.tensor.ones { 2 } < me.tensor { 2, 3 } and me.tensor.ones { 2 } <= me.tensor.ones { 2 })
assert(m:eq(me.tensor { { 1, 0 }, { 3, 0 } }):sum():item() == 2)
assert(m:gt(2):sum():item() == 2)

-- indexing is 1-based, as everywhere in Lua
assert(m[2][1]:item() == 3)
assert(#m == 2)
assert(m:narrow(2, 2, 1) == me.tensor { { 2 }, { 4 } })
assert(m:select(1, 1) == me.tensor { 1, 2 })
local values, indices = me.tensor { { 1, 9, 3 }, { 7, 2, 8 } }:max(2)
assert(values == me.tensor { 9, 8 } and indices == me.tensor { 2, 3 })
assert(m:mean():item() == 2.5)
assert(me.tensor.arange(5):sum():item() == 10)
assert(me.tensor.arange(1, 2, 0.25):numel() == 4)
assert(me.tensor.zeros { 3, 4 }:sum():item() == 0 and me.tensor.ones(3, 4):sum():item() == 12)
assert(me.tensor.zeros({ 2 }, { dtype = "float64" }):dtype() == "float64")
assert(m:to("float64"):dtype() == "float64")
assert(m:reshape { 4 } == me.tensor { 1, 2, 3, 4 })
local nested = m:totable()
assert(nested[2][2] == 4)
assert(f:allclose(f + 1e-9))

-- tostring shows values the way LibTorch prints them
local s = tostring(me.tensor { { 1.5, 2 }, { 3, 4 } })
assert(s:find("1.5") and s:find("CPUFloatType{2,2}"), s)

-- wrong argument types say which argument and what was expected
expect_error(function() me.tensor.randn("big") end, "bad argument #1 to 'randn' %(size")
expect_error(function() m:matmul(3) end, "bad argument #1 to 'matmul' %(tensor expected, got number%)")
expect_error(function() m:narrow("x", 1, 1) end, "bad argument #1 to 'narrow' %(integer expected, got string%)")
expect_error(function() return m[3] end, "index 3 out of range for dimension 1 of size 2")
expect_error(function() me.tensor { { 1, 2 }, { 3 } } end, "ragged")
expect_error(function() m:item() end, "needs a tensor with one element")
expect_error(function() m:to("tpu") end, "unknown device 'tpu'")
expect_error(function() return m + "x" end, "tensor or number expected, got string")
print("test_tensor: all checks passed")
