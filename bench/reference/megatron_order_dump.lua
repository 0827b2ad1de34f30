-- Writes every sample of one split as me.data.loader hands them out (micro 1, one rank), for
-- bench/reference/megatron_order.py to compare with Megatron's GPTDataset / BlendedDataset.
-- Its arguments come in the environment (a script's own arguments are recipe overrides):
--   ME_ORDER_OUT=FILE ME_ORDER_SPLIT=train|valid|test ME_ORDER_SEQ=64 ME_ORDER_SEED=1234
--   ME_ORDER_SAMPLES=N ME_ORDER_DATA_SPLIT=98,2,0 ME_ORDER_SOURCE=prefix=P|blend=W1:P1,W2:P2 \
--   megaengine megatron_order_dump.lua
-- SAMPLES: the samples asked of that split (Megatron's size). FILE gets a first line
-- "samples N", then per sample a line of its seq tokens and a line of its seq labels.
local me = require "megaengine"
local function need(name)
  local v = os.getenv(name)
  assert(v and v ~= "", "megatron_order_dump.lua: set " .. name .. " (see the comment at the top)")
  return v
end
local out_path, split, seq, seed = need "ME_ORDER_OUT", need "ME_ORDER_SPLIT", need "ME_ORDER_SEQ", need "ME_ORDER_SEED"
local samples, data_split, source = need "ME_ORDER_SAMPLES", need "ME_ORDER_DATA_SPLIT", need "ME_ORDER_SOURCE"
seq, seed, samples = tonumber(seq), tonumber(seed), tonumber(samples)

local spec = { split = data_split }
if source:sub(1, 7) == "prefix=" then
  spec.prefix = source:sub(8)
else
  assert(source:sub(1, 6) == "blend=", "the data is prefix=P or blend=W1:P1,W2:P2, got " .. source)
  spec.blend = {}
  for w, p in source:sub(7):gmatch("([^:,]+):([^,]+)") do spec.blend[#spec.blend + 1] = { tonumber(w), p } end
end

local loader = me.data.loader(me.data.gpt(spec), { seq = seq, seed = seed, micro = 1, iters = samples, split = split })
local total = tonumber(tostring(loader):match("BatchLoader: (%d+) "))
local f = assert(io.open(out_path, "w"))
f:write("samples ", total, "\n")
for _ = 1, total do
  local tokens, labels = loader:next()
  f:write(table.concat(tokens:totable()[1], " "), "\n", table.concat(labels:totable()[1], " "), "\n")
end
f:close()
print(("megatron_order_dump: %d %s samples written to %s"):format(total, split, out_path))
