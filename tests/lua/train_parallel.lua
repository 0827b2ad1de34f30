-- A small training run whose per-step losses (the global-batch mean) rank 0 writes to
-- $ME_LOSS_FILE: tests/cli/dp_equivalence.sh runs it under several layouts and compares.
local me = require "megaengine"
local out = os.getenv("ME_LOSS_FILE")
local rank = tonumber(os.getenv("RANK") or "0")
local file = (rank == 0 and out) and assert(io.open(out, "w"))
-- ME_GPT_PREFIX: train on GPT-2 tokenized Moby Dick through the .bin/.idx loader instead of bytes.
local gpt = os.getenv("ME_GPT_PREFIX")
return me.recipe {
  name = "equivalence",
  seed = 7,
  -- Padding the 50257 GPT-2 ids to a multiple of 64 x tp gives 50304 rows at tp 1 and 2 alike, so
  -- every layout trains the same model (Megatron's default of 128 x tp would not).
  -- ME_EQUIV_MODEL=llama: the LLaMA family instead (RoPE, RMSNorm, SwiGLU, grouped-query attention).
  model = os.getenv("ME_EQUIV_MODEL") == "llama"
          and me.model.llama { vocab = 256, vocab_divisible_by = 64, seq = 32, layers = 2, hidden = 64, heads = 4,
                               query_groups = 2, ffn_hidden = 128 }
          or me.model.gpt { vocab = gpt and 50257 or 256, vocab_divisible_by = 64, seq = 32, layers = 2, hidden = 64,
                            heads = 4 },
  data = gpt and me.data.gpt { prefix = gpt, source = me.asset "moby-dick.txt", tokenizer = me.tokenizer.gpt2 {},
                               split = "98,2,0" }
             or me.data.text { path = me.asset "moby-dick.txt" },
  batch = { micro = 2, global = 8 },
  optimizer = me.optim.adamw { lr = 2e-3, weight_decay = 0.1, clip = 1.0 },
  schedule = me.schedule.cosine { warmup_iters = 5, min_lr = 1e-4 },
  train = { iters = 20, log_interval = 1, eval_iters = 0 },
  comm = { timeout_s = 60 },
  on_log = function(r)
    if file then
      file:write(("%.9g %.9g\n"):format(r.loss, r.grad_norm))
      file:flush()
    end
  end,
}
