-- A GPT-2-medium-sized model (24 x 1024, 16 heads, seq 1024, GPT-2 vocabulary: 355M
-- parameters) trained in bf16 on the byte-level Moby Dick text, for throughput and memory.
--   megaengine bench/gpt350m.lua device=cuda train.peak_tflops=<bench/matmul_peak.lua>
--   megaengine --nproc 4 bench/gpt350m.lua device=cuda parallel.distributed_optimizer=true
local me = require "megaengine"
return me.recipe {
  name = "gpt350m",
  device = "cuda",
  precision = "bf16",
  model = me.model.gpt { vocab = 50257, seq = 1024, layers = 24, hidden = 1024, heads = 16 },
  data = me.data.text { path = me.asset "moby-dick.txt", holdout = 0.05 },
  batch = { micro = 8 },
  optimizer = me.optim.adamw { lr = 3e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 },
  schedule = me.schedule.cosine { warmup_iters = 10, min_lr = 3e-5 },
  train = { iters = 40, log_interval = 10, eval_iters = 0 },
  comm = { timeout_s = 300 },
}
