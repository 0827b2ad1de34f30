-- One benchmark row for bench/speed/table.py: trains a configuration on one GPU (or every rank
-- of --nproc N) for ME_BENCH_WARMUP + ME_BENCH_STEPS steps on the byte-level text and appends a
-- JSON line (tokens/s, ms/step: the median log window after the warm-up, model TFLOP/s per GPU,
-- MFU, peak memory) to ME_BENCH_JSON.
--   ME_BENCH_MODEL=gpt1.3b ME_BENCH_MICRO=4 ME_BENCH_PEAK=<TFLOP/s> ME_BENCH_JSON=rows.jsonl \
--     ME_BENCH_OVERRIDES="parallel.tp=2 ..." megaengine bench/speed/megaengine_row.lua
-- The models are bench/reference/train_ref.py's, so rows compare like for like.
local me = require "megaengine"
local env = function(k, d) return os.getenv(k) or d end
local models = {
  ["gpt1.3b"] = me.model.gpt { vocab = 50257, seq = 2048, layers = 24, hidden = 2048, heads = 16 },
  ["llama1b"] = me.model.llama { vocab = 32000, seq = 2048, layers = 22, hidden = 2048, heads = 32,
                                 query_groups = 4, ffn_hidden = 5632 },
  ["gpt-small"] = me.model.gpt { vocab = 50257, seq = 1024, layers = 12, hidden = 768, heads = 12 },
  -- the GPT-39B width (recipes/gpt39b.lua) at 2 layers: one GPU holds it at micro 1
  ["gpt39b-2l"] = me.model.gpt { vocab = 50257, seq = 2048, layers = 2, hidden = 8192, heads = 64 },
  -- the LLaMA-2-70B width (recipes/llama2_70b.lua: GQA 8, ffn 28672, seq 4096) at 2 layers
  ["llama70b-2l"] = me.model.llama { vocab = 32000, seq = 4096, layers = 2, hidden = 8192, heads = 64, query_groups = 8,
                                     ffn_multiplier = 1.3, ffn_multiple_of = 4096 },
}
local name = env("ME_BENCH_MODEL", "gpt-small")
local model = assert(models[name], "ME_BENCH_MODEL: one of gpt1.3b, llama1b, gpt-small, gpt39b-2l, llama70b-2l")
local warmup, steps = tonumber(env("ME_BENCH_WARMUP", "10")), tonumber(env("ME_BENCH_STEPS", "30"))
local rank = tonumber(env("RANK", "0"))
local windows = {}

local recipe = me.recipe {
  name = "bench-" .. name,
  device = "cuda",
  precision = "bf16",
  model = model,
  data = me.data.text { path = me.asset "moby-dick.txt" },
  batch = { micro = tonumber(env("ME_BENCH_MICRO", "4")) },
  optimizer = me.optim.adamw { lr = 3e-4, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 },
  schedule = me.schedule.constant {},
  train = { iters = warmup + steps, log_interval = warmup, eval_iters = 0,
            peak_tflops = tonumber(env("ME_BENCH_PEAK", "0")) + 0.0 },
  comm = { timeout_s = 300 },
  -- every log window after the first (the warm-up) is timed
  on_log = function(r) if r.iteration > warmup then windows[#windows + 1] = r end end,
}
local overrides = {}
for o in env("ME_BENCH_OVERRIDES", ""):gmatch("%S+") do overrides[#overrides + 1] = o end
me.apply_overrides(recipe, overrides)
local trainer = me.trainer(recipe)
me.cuda.reset_peak_memory()
trainer:run()
-- The median window: one slow window (a late host, a GPU clock dip) moves it less than a mean.
local times = {}
for _, w in ipairs(windows) do times[#times + 1] = w.ms_per_iter end
table.sort(times)
local n = #times
local ms = n % 2 == 1 and times[(n + 1) // 2] or (times[n // 2] + times[n // 2 + 1]) / 2
local r = windows[#windows]
local tokens_per_s = r.tokens_per_s * r.ms_per_iter / ms
local world = tonumber(env("WORLD_SIZE", "1"))
local dp = world // (recipe.parallel.tp * recipe.parallel.pp)
local accum = (recipe.batch.global or 0) > 0 and recipe.batch.global // (recipe.batch.micro * dp) or 1
local row = {
  engine = "megaengine", model = name,
  -- "1 GPU" as the reference rows say; parallel layouts name what differs from plain DP
  layout = ("%s GPU%s%s%s"):format(env("WORLD_SIZE", "1"), env("WORLD_SIZE", "1") == "1" and "" or "s",
                                   (recipe.parallel.tp > 1 and (" tp=" .. recipe.parallel.tp) or "")
                                   .. (recipe.parallel.pp > 1 and (" pp=" .. recipe.parallel.pp) or "")
                                   .. (recipe.parallel.pp_first_layers > 0 and (" first stage " .. recipe.parallel.pp_first_layers .. " layers") or "")
                                   .. (recipe.parallel.pp > 1 and recipe.parallel.pp_split ~= "even" and (" " .. recipe.parallel.pp_split .. " split") or ""),
                                   recipe.parallel.distributed_optimizer and " distopt" or "")
           .. ((env("ME_KERNELS", "all") ~= "all") and (" kernels=" .. env("ME_KERNELS", "")) or "")
           .. ((env("ME_ATTENTION", "auto") ~= "auto") and (" attention=" .. env("ME_ATTENTION", "")) or "")
           .. ((env("ME_BENCH_LABEL", ""):match("%S")) and (" " .. env("ME_BENCH_LABEL", ""):gsub("^%s+", ""):gsub("%s+$", "")) or ""),
  micro = recipe.batch.micro, accum = accum, seq = model.seq, steps = steps,
  tokens_per_s = tokens_per_s, ms_per_step = ms,
  tflops_per_gpu = r.tflops_per_gpu * r.ms_per_iter / ms,
  mfu = recipe.train.peak_tflops > 0 and r.mfu * r.ms_per_iter / ms or nil,
  peak_mem_mib = me.cuda.memory().peak / 1048576, final_loss = r.loss,
}
if rank == 0 then
  local keys, parts = {}, {}
  for k in pairs(row) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v = row[k]
    parts[#parts + 1] = ("%q: %s"):format(k, type(v) == "string" and ("%q"):format(v) or tostring(v))
  end
  local line = "{" .. table.concat(parts, ", ") .. "}"
  print(line)
  local out = os.getenv("ME_BENCH_JSON")
  if out then local f = assert(io.open(out, "a")); f:write(line, "\n"); f:close() end
end
