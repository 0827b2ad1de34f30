-- Any row of the user's GPT size table (Megatron's GPT-3 sizes, seq 2048, GPT-2's vocabulary),
-- chosen with the environment variable GPT_SIZE (default 1.7b), trained as recipes/gpt39b.lua
-- trains the 39.1B row: micro batch 1, global batch 288, Adam (0.9, 0.95), lr 6e-5 cosine to 6e-6,
-- clip 1.0, weight decay 0.1, by samples, bf16 with the distributed optimizer. Each row has its
-- layout below (tensor parallelism alone below 10B, then with pipeline parallelism, and with
-- sequence parallelism above 100B, as the seeds advise), for the GPUs it names.
--
-- Submit (sbatch passes the environment on; DATA_PATH as in the seeds):
--   GPT_SIZE=18.4b sbatch slurm/train.sbatch recipes/gpt.lua
--   GPT_SIZE=76.1b sbatch --nodes=4 slurm/train.sbatch recipes/gpt.lua        # 32 GPUs
-- Check a row's layout and memory first, anywhere (no GPU, no data needed):
--   GPT_SIZE=18.4b megaengine --dry-run recipes/gpt.lua --world 16
-- Why an environment variable and not an override: every key=value after the recipe sets a field
-- of the table the recipe returns, and the size is not a field but picks the table.
--
-- size    heads hidden layers  GPUs  layout (tp x pp x dp)   expected per GPU (dry run, busiest stage)
-- 1.7b     24   2304    24      16   1 x 1 x 16              17.4 GB
-- 3.6b     32   3072    30      16   1 x 1 x 16              33.6 GB
-- 7.5b     32   4096    36      16   2 x 1 x 8               38.1 GB
-- 18.4b    48   6144    40      16   4 x 2 x 2               39.8 GB
-- 39.1b    64   8192    48      16   4 x 2 x 2               77.0 GB
-- 76.1b    80  10240    60      32   8 x 4 x 1               63.4 GB
-- 145.6b   96  12288    80      64   8 x 8 x 1 (+ seq. par.) 63.1 GB
-- 310.1b  128  16384    96     128   8 x 16 x 1 (+ seq. par.) 76.3 GB
--
-- Data as recipes/gpt39b.lua: $DATA_PATH/gpt2/my-gpt2_text_document.bin/.idx, gpt2-vocab.json, gpt2-merges.txt.
-- The seeds' variants, as overrides after the recipe:
--   benchmark mode (no evaluation):  train.eval_iters=0 data.split=100,0,0
--   iterations instead of samples:   train.samples=0 train.iters=50 schedule.decay_samples=0 schedule.warmup_samples=0
--                                    schedule.decay_iters=45 schedule.warmup_iters=2
--   another layout:                  parallel.tp=... parallel.pp=... (the dry run says whether it fits)
local me = require "megaengine"

local layouts = {
  ["1.7b"] = { tp = 1, pp = 1 }, ["3.6b"] = { tp = 1, pp = 1 }, ["7.5b"] = { tp = 2, pp = 1 },
  ["18.4b"] = { tp = 4, pp = 2 }, ["39.1b"] = { tp = 4, pp = 2 }, ["76.1b"] = { tp = 8, pp = 4 },
  ["145.6b"] = { tp = 8, pp = 8, sp = true }, ["310.1b"] = { tp = 8, pp = 16, sp = true },
}
local size = (os.getenv "GPT_SIZE" or "1.7b"):lower():gsub("b$", "") .. "b"
if size == "39b" then size = "39.1b" end
local layout = layouts[size]
if not layout then
  local names = {}
  for name in pairs(layouts) do names[#names + 1] = name end
  table.sort(names, function(a, b) return tonumber(a:sub(1, -2)) < tonumber(b:sub(1, -2)) end)
  error(("GPT_SIZE=%s is not a row of the size table: use one of %s"):format(os.getenv "GPT_SIZE",
    table.concat(names, ", ")), 0)
end

-- $DATA_PATH/<rel>. The dry run reads no data, so there it may be unset.
local function data_file(rel)
  local root = os.getenv "DATA_PATH"
  if root and root ~= "" then return root .. "/" .. rel end
  if os.getenv "ME_DRY_RUN" then return "$DATA_PATH/" .. rel end
  error("DATA_PATH is not set: export DATA_PATH=/fsx/data (the directory holding gpt2/my-gpt2_text_document.bin/.idx, "
        .. "gpt2/gpt2-vocab.json and gpt2/gpt2-merges.txt), or look first with megaengine --dry-run", 0)
end

-- Checkpoints every 1000 iterations under $DATA_PATH/checkpoints (as the seeds), resumed from
-- automatically when the job is requeued; TensorBoard and metrics.jsonl under $DATA_PATH/logs.
return me.recipe {
  name = "gpt-" .. size,
  device = "cuda",
  precision = "bf16",
  model = me.presets.gpt[size] { seq = 2048, init_std = 0.006 },
  data = me.data.gpt {
    prefix = data_file "gpt2/my-gpt2_text_document",
    split = "98,2,0",
    tokenizer = me.tokenizer.gpt2 { vocab_file = data_file "gpt2/gpt2-vocab.json",
                                    merge_file = data_file "gpt2/gpt2-merges.txt" },
  },
  batch = { micro = 1, global = 288 },
  parallel = { tp = layout.tp, pp = layout.pp, sequence_parallel = layout.sp or false, distributed_optimizer = true },
  optimizer = me.optim.adamw { lr = 6e-5, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 },
  schedule = me.schedule.cosine { min_lr = 6e-6, warmup_samples = 183105, decay_samples = 126953125 },
  train = { samples = 146484375, log_interval = 10, eval_interval = 1000, eval_iters = 40 },
  checkpoint = { dir = data_file("checkpoints/gpt-" .. size), interval = 1000 },
  log = { dir = data_file("logs/gpt-" .. size) },
}
