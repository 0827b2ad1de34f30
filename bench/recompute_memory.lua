-- Activation recomputation on one GPU: peak memory of one forward + backward with recompute
-- none / selective / full, against what the activation formula predicts.
--
-- Per layer and token, the GPT block stores (fp32, fused SDPA so no seq^2 scores):
--   norm1 input, q/k/v input (shared), q, k, v, attention output, proj input, norm2 input,
--   fc1 input, GeLU input (4h), fc2 input (4h)  =  17 h values   (Megatron's 34sbh in bytes
--   at 2 bytes/value, without the 5as^2b of unfused attention)
-- Full recomputation keeps only each layer's input (1 h) and rebuilds one layer at a time
-- in backward, so it saves about (layers - 1) x 16 x tokens x hidden x 4 bytes.
--   megaengine bench/recompute_memory.lua        (needs a GPU)
local me = require "megaengine"
assert(me.cuda.is_available(), "this benchmark needs a CUDA GPU")
local layers, hidden, heads, seq, batch = 16, 1024, 16, 2048, 4
local tokens_n = seq * batch
local MiB = 1024 * 1024
me.manual_seed(1)
local tokens = me.tensor.randint(0, 50257, { batch, seq }):to("cuda")
local labels = me.tensor.randint(0, 50257, { batch, seq }):to("cuda")

local results = {}
print(("# GPT %d layers, hidden %d, seq %d, micro batch %d, fp32; one forward + backward"):format(layers, hidden, seq, batch))
print(("# %-10s %14s %14s"):format("recompute", "peak (MiB)", "above weights"))
for _, mode in ipairs { "none", "selective", "full" } do
  local model = me.model.gpt { vocab = 50257, seq = seq, layers = layers, hidden = hidden, heads = heads,
                               recompute = mode }:build(1):to("cuda")
  me.cuda.synchronize()
  local base = me.cuda.memory().allocated
  me.cuda.reset_peak_memory()
  model:loss(tokens, labels):backward()
  me.cuda.synchronize()
  local peak = me.cuda.memory().peak
  results[mode] = peak - base
  print(("  %-10s %14.1f %14.1f"):format(mode, peak / MiB, (peak - base) / MiB))
  model = nil
  collectgarbage()
  collectgarbage()
end
local predicted = (layers - 1) * 16 * tokens_n * hidden * 4
local measured = results.none - results.full
print(("# saved by full recompute: measured %.1f MiB, predicted (layers-1) x 16 x tokens x hidden x 4 B = %.1f MiB, ratio %.3f")
  :format(measured / MiB, predicted / MiB, measured / predicted))
print(("# selective (attention core only) saves %.1f MiB: the fused kernel already keeps no seq^2 scores"):format(
  (results.none - results.selective) / MiB))
