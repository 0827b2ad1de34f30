-- fp8 against bf16 convergence (#36, acceptance 2): a ~350M-parameter GPT or LLaMA trained for
-- 1,000 steps on the State of the Union addresses (2.07M GPT-2 tokens, 233 speeches, one document
-- each), the same seed and data at either precision, on one GPU. The model is picked by the
-- environment (a key=value override cannot pick a table); the precision by an override:
--   CONV_MODEL=gpt   megaengine bench/fp8/convergence.lua log.dir=OUT/gpt_bf16
--   CONV_MODEL=llama megaengine bench/fp8/convergence.lua precision=fp8 log.dir=OUT/llama_fp8
-- bench/fp8/convergence.sh runs all four and compares them (bench/fp8/compare.py).
-- Fetch the corpus first: scripts/fetch_assets.sh --sotu (the first run tokenizes it into
-- assets/sotu_gpt2_text_document.bin/.idx, ~1 s).
--
-- GPT:   24 x 1024, 16 heads, tied embeddings (GPT-2 medium):                  355M parameters
-- LLaMA: 20 x 1024, 16 heads, SwiGLU 2816, RoPE, RMSNorm, untied output:      360M parameters
--        (24 layers would be 411M: the untied 50k x 1024 output layer adds 51M, so four layers
--        fewer keep the two models of one size)
-- A step is 8 samples x 1024 tokens = 8,192 tokens, so 1,000 steps are 8.2M tokens, about four
-- passes over the training split: the comparison is of the two precisions, not of a good model.
-- Validation: the last 5% of the documents (the 12 speeches of 2010-2021, 93k tokens), 10
-- batches every 100 steps. metrics.jsonl in log.dir holds each log interval's training loss
-- (the mean of its 10 steps), the skipped and non-finite step counts, and each validation loss.
local me = require "megaengine"

-- A dry run reads no data, so there the corpus need not be fetched yet.
local found, corpus = pcall(me.asset, "sotu.txt")
if not found then
  if not os.getenv "ME_DRY_RUN" then error(corpus .. " (this one: scripts/fetch_assets.sh --sotu)", 0) end
  corpus = "assets/sotu.txt"
end
-- The shape both models share (GPT-2's vocabulary, 1024 wide and long, 16 heads), plus t.
local function shape(t)
  for k, v in pairs { vocab = 50257, seq = 1024, hidden = 1024, heads = 16 } do t[k] = v end
  return t
end
local models = {
  gpt = function() return me.model.gpt(shape { layers = 24 }) end,
  llama = function() return me.model.llama(shape { layers = 20 }) end,  -- ffn_hidden by LLaMA's rule: 2816
}
local which = os.getenv "CONV_MODEL" or "gpt"
if not models[which] then error(("CONV_MODEL=%s: use gpt or llama"):format(which), 0) end

return me.recipe {
  name = "fp8conv_" .. which,
  device = "cuda",
  seed = 1234,             -- the same weights and sample order at both precisions
  precision = "bf16",      -- the run under test passes precision=fp8
  model = models[which](),
  data = me.data.gpt {
    prefix = corpus:gsub("%.txt$", "_gpt2_text_document"),
    source = corpus, source_format = "text",   -- one speech per document, eod after each
    tokenizer = me.tokenizer.gpt2 {},           -- encoder.json + vocab.bpe from the assets
    split = "95,5,0",
  },
  batch = { micro = 8 },
  optimizer = me.optim.adamw { lr = 3e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 },
  schedule = me.schedule.cosine { warmup_iters = 50, min_lr = 3e-5 },
  -- nan_policy "skip": a non-finite step is skipped and counted (metrics' nan_iterations and
  -- skipped_iterations), so compare.py can fail the run on it instead of the run stopping.
  train = { iters = 1000, log_interval = 10, eval_interval = 100, eval_iters = 10, nan_policy = "skip" },
  log = { dir = "" },      -- convergence.sh passes log.dir=OUT/<model>_<precision>
}
