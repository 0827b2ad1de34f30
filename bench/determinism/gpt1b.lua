-- GPT of about 1.1B parameters (24 layers of 2048, seq 1024) for bench/determinism/check.sh:
-- trains on the byte-level text, logs every step and writes each step's loss and gradient
-- norm as hexadecimal floats (exact bits) to ME_DET_LOG on rank 0.
local me = require "megaengine"
local log = os.getenv("ME_DET_LOG")
local rank = tonumber(os.getenv("RANK") or "0")
local out = (log and rank == 0) and assert(io.open(log, "a")) or nil
return me.recipe {
  name = "determinism-gpt1b",
  device = "cuda",
  precision = "bf16",
  seed = 1234,
  model = me.model.gpt { vocab = 50257, seq = 1024, layers = 24, hidden = 2048, heads = 16 },
  data = me.data.text { path = me.asset "moby-dick.txt" },
  batch = { micro = 4, global = 32 },
  optimizer = me.optim.adamw { lr = 3e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 },
  schedule = me.schedule.cosine { warmup_iters = 10, min_lr = 3e-5 },
  train = { iters = 100, log_interval = 1, eval_iters = 0, deterministic = true },
  on_log = function(r)
    if out then
      out:write(("%d %a %a\n"):format(r.iteration, r.loss, r.grad_norm))
      out:flush()
    end
  end,
}
