-- The embedded default: a small GPT on Moby Dick through the Megatron data pipeline, on the CPU
-- in about two minutes. The first run preprocesses the text with GPT-2's BPE into
-- assets/moby-dick_gpt2_text_document.bin/.idx (what `megaengine preprocess` makes); later runs
-- reuse it and the cached sample index. Fetch the text and tokenizer first: scripts/fetch_assets.sh
local me = require "megaengine"

local corpus = me.asset "moby-dick.txt"

return me.recipe {
  name = "gpt_tiny",
  device = "cpu",          -- device=cuda on a GPU machine
  seed = 1234,
  model = me.model.gpt { vocab = 50257, seq = 64, layers = 4, hidden = 128, heads = 4 },
  data = me.data.gpt {
    prefix = corpus:gsub("%.txt$", "_gpt2_text_document"),
    source = corpus, source_format = "text",  -- a document per paragraph, eod after each
    tokenizer = me.tokenizer.gpt2 {},          -- encoder.json + vocab.bpe from the assets
    split = "98,2,0",
  },
  batch = { micro = 16 },
  optimizer = me.optim.adamw { lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 },
  schedule = me.schedule.cosine { warmup_iters = 20, min_lr = 3e-4 },
  train = { iters = 250, log_interval = 25, eval_interval = 125, eval_iters = 10 },
  sample = { prompt = "Call me Ishmael. ", tokens = 40, top_k = 5, temperature = 0.8 },
}
