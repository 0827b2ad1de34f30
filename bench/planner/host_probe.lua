-- One point of the planner's host term (bench/planner/calibrate_host.sh): trains a GPT so narrow
-- (hidden 256, seq 256, micro 1) that its GPU work is negligible, so a step takes what the host
-- needs to issue it, on every rank of the launch as one tp group, and prints one JSON line:
-- {"tp": ..., "sequence_parallel": ..., "layers": ..., "micro_batches": ..., "ms_per_step": mean of
-- the timed windows}.
--   ME_PROBE_LAYERS=2 ME_PROBE_SP=true megaengine --nproc 2 bench/planner/host_probe.lua
-- Environment: ME_PROBE_LAYERS (2), ME_PROBE_MICRO_BATCHES (1: micro-batches a step),
-- ME_PROBE_SP (true; tp 1 has none), ME_PROBE_WARMUP (5),
-- ME_PROBE_STEPS (20), ME_PROBE_OVERRIDES (recipe overrides, to compare a setting's host cost:
-- e.g. "parallel.tp_comm_backend=nccl", or "train.profile_at=3 train.profile_trace=/tmp/p.json"
-- for bench/speed/trace_ops.py).
local me = require "megaengine"
local env = function(k, d) return os.getenv(k) or d end
local tp = tonumber(env("WORLD_SIZE", "1"))
local layers = tonumber(env("ME_PROBE_LAYERS", "2"))
local micro_batches = tonumber(env("ME_PROBE_MICRO_BATCHES", "1"))
local warmup, steps = tonumber(env("ME_PROBE_WARMUP", "5")), tonumber(env("ME_PROBE_STEPS", "20"))
local sp = tp > 1 and env("ME_PROBE_SP", "true") == "true"
local cuda = me.cuda.is_available()
local windows = {}
local recipe = me.recipe {
  name = "host-probe",
  device = cuda and "cuda" or "cpu",
  precision = cuda and "bf16" or "fp32",
  model = me.model.gpt { vocab = 256, seq = 256, layers = layers, hidden = 256, heads = 8 },
  data = me.data.text { path = me.asset "moby-dick.txt" },
  batch = { micro = 1, global = micro_batches },
  parallel = { tp = tp, sequence_parallel = sp },
  optimizer = me.optim.adamw { lr = 1e-4 },
  schedule = me.schedule.constant {},
  train = { iters = warmup + steps, log_interval = warmup, eval_iters = 0 },
  -- every log window after the first (the warm-up) is timed
  on_log = function(r) if r.iteration > warmup then windows[#windows + 1] = r.ms_per_iter end end,
}
local overrides = {}
for o in env("ME_PROBE_OVERRIDES", ""):gmatch("%S+") do overrides[#overrides + 1] = o end
me.apply_overrides(recipe, overrides)
me.trainer(recipe):run()
local ms = 0
for _, w in ipairs(windows) do ms = ms + w / #windows end
if tonumber(env("RANK", "0")) == 0 then
  print(('{"tp": %d, "sequence_parallel": %s, "layers": %d, "micro_batches": %d, "ms_per_step": %.4f}'):format(
    tp, tostring(sp), layers, micro_batches, ms))
end
