-- Run under megaengine --nproc 2: two data-parallel ranks read GPT-2 tokenized Moby Dick through
-- the training loader. Checks: (1) a loader restarted at consumed_samples = K gives exactly the
-- batches the first one gave after K; (2) the two ranks' shares are disjoint and together are
-- the global batch a single-rank loader sees, in Megatron's order.
local me = require "megaengine"
local w = me.comm.init { timeout_s = 120 }
local r, n = w:rank(), w:size()
assert(n == 2, "run me under --nproc 2")

local base = (r == 0) and os.tmpname() or ""  -- a file Lua creates; the directory sits beside it
local dir = base .. ".d"
dir = me.comm.all_gather_object(dir)[1]
if r == 0 then
  assert(os.execute("mkdir -p '" .. dir .. "'"))
  local s = me.data.preprocess { input = me.asset "moby-dick.txt", format = "text", output = dir .. "/moby",
                                 tokenizer = me.tokenizer.gpt2 {}, append_eod = true, workers = 2 }
  assert(s.documents > 2000 and s.tokens > 300000, "preprocessed " .. s.documents .. " documents")
end
w:barrier()

local data = me.data.gpt { prefix = dir .. "/moby", split = "98,2,0" }
local function loader(consumed, dp, dp_rank, micro)
  local opts = { seq = 32, micro = micro, dp = dp, dp_rank = dp_rank, iters = 12, seed = 9,
                 consumed_samples = consumed, builder = (r == 0) }
  -- the builder (rank 0) writes the index cache first; the other rank then loads it
  if r == 0 then opts.builder = true; local l = me.data.loader(data, opts); w:barrier(); return l end
  w:barrier()
  opts.builder = false
  return me.data.loader(data, opts)
end

local global = 2 * n
local first = loader(0, n, r, 2)
local seen = {}
for i = 1, 12 do seen[i] = first:next() end
assert(first:consumed_samples() == 12 * global)

local K = 5 * global
local resumed = loader(K, n, r, 2)
for i = 6, 12 do
  local tokens, _, at = resumed:next()
  assert(at == (i - 1) * global, "batch " .. i .. " starts at sample " .. at)
  assert(tokens == seen[i], ("rank %d: batch %d after resuming at %d differs"):format(r, i, K))
end

-- Each rank's share is its rows of the single-rank global batch; the shares differ.
local whole = loader(0, 1, 0, global)
for i = 1, 3 do
  local all = whole:next()
  assert(all:narrow(1, r * 2 + 1, 2) == seen[i], ("rank %d: batch %d is not its share of the global batch"):format(r, i))
end
local both = w:all_gather(seen[1]:reshape { 1, -1 })
assert(both[1] ~= both[2], "the two DP ranks got the same samples")

-- With eod_mask_loss the loader gives what the trainer trains on: the same tokens, and the label
-- ignored (-100) exactly where the input is end-of-document.
local masked = me.data.loader(me.data.gpt { prefix = dir .. "/moby", split = "98,2,0", eod_mask_loss = true,
                                            tokenizer = me.tokenizer.gpt2 {} },
                              { seq = 32, micro = 2, dp = n, dp_rank = r, iters = 12, seed = 9, builder = false })
local eods = 0
for i = 1, 12 do
  local tokens, labels = masked:next()
  assert(tokens == seen[i], ("rank %d: eod masking changed the tokens of batch %d"):format(r, i))
  assert(labels:eq(-100) == tokens:eq(50256), ("rank %d: batch %d masks other positions than eod"):format(r, i))
  eods = eods + tokens:eq(50256):sum():item()
end
assert(eods > 0, "no end-of-document in 12 batches: the check saw nothing")

-- me.data.loader reads any split: valid is the 2% of 98,2,0, its own samples, far fewer.
if r == 0 then
  local train_n = tonumber(tostring(whole):match("BatchLoader: (%d+) train samples"))
  local valid = me.data.loader(data, { seq = 32, micro = 2, iters = 3, seed = 9, split = "valid" })
  local valid_n = tonumber(tostring(valid):match("BatchLoader: (%d+) valid samples"))
  assert(train_n and valid_n and valid_n >= 6 and valid_n * 20 < train_n, tostring(valid) .. " vs " .. tostring(whole))
  assert(valid:next() ~= seen[1], "the valid split gave the training split's first batch")
  local ok, err = pcall(me.data.loader, data, { seq = 32, micro = 2, iters = 3, split = "dev" })
  assert(not ok and tostring(err):find("'dev' is not a split", 1, true), "split = 'dev' gave: " .. tostring(err))
end

w:barrier()
if r == 0 then os.execute("rm -rf '" .. dir .. "'"); os.remove(base) end
print(("rank %d: resumed at consumed_samples %d with identical batches; test_loader_resume passed"):format(r, K))
