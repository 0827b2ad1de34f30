-- LLaMA-2 13B (40 layers, hidden 5120, 40 heads, SwiGLU 13824, RoPE, RMSNorm, untied output; 13.02B
-- parameters) in the seeds' LLaMA-2 setup: micro batch 1, global batch 2048, seq 4096, AdamW (0.9,
-- 0.95), lr 6e-5 cosine to 6e-6, clip 1.0, weight decay 0.1, LLaMA-2's SentencePiece tokenizer,
-- bf16; on 2 nodes of 8 H100s as tp 2 with sequence parallelism x pp 1 x dp 8, the optimizer
-- sharded over dp 8 (as Megatron's 13B example).
--
-- Submit (DATA_PATH as in the seeds, e.g. export DATA_PATH=/fsx/data):
--   sbatch slurm/train.sbatch recipes/llama2_13b.lua
-- Check the layout and the memory first, anywhere (no GPU, no data, no DATA_PATH needed):
--   megaengine --dry-run recipes/llama2_13b.lua --world 16
-- Expected memory per GPU (that dry run; GB = 10^9 bytes): 71.3 GB of 80 GB, of which LibTorch's
-- allocator peak is 66.1 GB (63,065 MiB: bf16 weights 13.0, fp32 main grads 26.0, masters + AdamW
-- state sharded over dp 8 9.8, activations of 1 micro-batch 16.9).
--
-- Data under $DATA_PATH/llama2/ as recipes/llama2_70b.lua: tokenizer.model, my-llama2_text_document.bin/.idx.
-- The seeds' variants, as overrides after the recipe:
--   benchmark mode (no evaluation):  train.eval_iters=0 data.split=100,0,0
--   iterations instead of samples:   train.samples=0 train.iters=50 schedule.decay_samples=0 schedule.warmup_samples=0
--                                    schedule.decay_iters=45 schedule.warmup_iters=2
local me = require "megaengine"

-- $DATA_PATH/<rel>. The dry run reads no data, so there it may be unset.
local function data_file(rel)
  local root = os.getenv "DATA_PATH"
  if root and root ~= "" then return root .. "/" .. rel end
  if os.getenv "ME_DRY_RUN" then return "$DATA_PATH/" .. rel end
  error("DATA_PATH is not set: export DATA_PATH=/fsx/data (the directory holding llama2/my-llama2_text_document.bin/.idx "
        .. "and llama2/tokenizer.model), or look first with megaengine --dry-run", 0)
end

-- Checkpoints every 1000 iterations under $DATA_PATH/checkpoints (as the seeds), resumed from
-- automatically when the job is requeued; TensorBoard and metrics.jsonl under $DATA_PATH/logs.
return me.recipe {
  name = "llama2_13b",
  device = "cuda",
  precision = "bf16",
  model = me.presets.llama2["13b"] { seq = 4096, init_std = 0.006 },
  data = me.data.gpt {
    prefix = data_file "llama2/my-llama2_text_document",
    split = "98,2,0",
    tokenizer = me.tokenizer.sentencepiece { model_file = data_file "llama2/tokenizer.model" },
  },
  batch = { micro = 1, global = 2048 },
  parallel = { tp = 2, pp = 1, sequence_parallel = true, distributed_optimizer = true },
  optimizer = me.optim.adamw { lr = 6e-5, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 },
  -- The seeds' schedule in samples (as their GPT run; LLaMA's seed gives no length).
  schedule = me.schedule.cosine { min_lr = 6e-6, warmup_samples = 183105, decay_samples = 126953125 },
  train = { samples = 146484375, log_interval = 10, eval_interval = 1000, eval_iters = 40 },
  checkpoint = { dir = data_file "checkpoints/llama2_13b", interval = 1000 },
  log = { dir = data_file "logs/llama2_13b" },
}
