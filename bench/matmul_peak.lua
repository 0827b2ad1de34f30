-- The bf16 matmul peak of this GPU, measured: the denominator of MFU.
--   megaengine bench/matmul_peak.lua      (prints "bf16 matmul peak: N TFLOP/s")
local me = require "megaengine"
assert(me.cuda.is_available(), "needs a CUDA GPU")
local n = tonumber(os.getenv("ME_MATMUL_N") or 8192)
local a = me.tensor.randn({ n, n }, { dtype = "bfloat16", device = "cuda" })
local b = me.tensor.randn({ n, n }, { dtype = "bfloat16", device = "cuda" })
for _ = 1, 5 do a:matmul(b) end
me.cuda.synchronize()
local best = 0
for _ = 1, 5 do
  local iters = 20
  local t0 = me.clock()
  for _ = 1, iters do a:matmul(b) end
  me.cuda.synchronize()
  best = math.max(best, 2 * n ^ 3 * iters / (me.clock() - t0) / 1e12)
end
print(("bf16 matmul peak: %.1f TFLOP/s (%dx%dx%d, best of 5 x 20)"):format(best, n, n, n))
