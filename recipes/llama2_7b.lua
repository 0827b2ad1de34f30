-- LLaMA-2 7B (32 layers, hidden 4096, 32 heads, SwiGLU 11008, RoPE, RMSNorm, untied output; 6.74B
-- parameters) in the seeds' LLaMA-2 setup: micro batch 1, global batch 2048, seq 4096, AdamW (0.9,
-- 0.95), lr 6e-5 cosine to 6e-6, clip 1.0, weight decay 0.1, LLaMA-2's SentencePiece tokenizer,
-- bf16; on 2 nodes of 8 H100s by data parallelism alone (tp 1 x pp 1 x dp 16), the optimizer
-- sharded over the 16 GPUs (as Megatron's 7B example).
--
-- Submit (DATA_PATH as in the seeds, e.g. export DATA_PATH=/fsx/data):
--   sbatch slurm/train.sbatch recipes/llama2_7b.lua
-- Check the layout and the memory first, anywhere (no GPU, no data, no DATA_PATH needed):
--   megaengine --dry-run recipes/llama2_7b.lua --world 16
-- Expected memory per GPU (that dry run; GB = 10^9 bytes): 70.0 GB of 80 GB, of which LibTorch's
-- allocator peak is 65.4 GB (62,380 MiB: bf16 weights 13.5, fp32 main grads 27.0, masters + AdamW
-- state sharded over dp 16 5.1, activations of 1 micro-batch 19.5).
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
  name = "llama2_7b",
  device = "cuda",
  precision = "bf16",
  model = me.presets.llama2["7b"] { seq = 4096, init_std = 0.006 },
  data = me.data.gpt {
    prefix = data_file "llama2/my-llama2_text_document",
    split = "98,2,0",
    tokenizer = me.tokenizer.sentencepiece { model_file = data_file "llama2/tokenizer.model" },
  },
  batch = { micro = 1, global = 2048 },
  parallel = { tp = 1, pp = 1, distributed_optimizer = true },
  optimizer = me.optim.adamw { lr = 6e-5, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 },
  -- The seeds' schedule in samples (as their GPT run; LLaMA's seed gives no length).
  schedule = me.schedule.cosine { min_lr = 6e-6, warmup_samples = 183105, decay_samples = 126953125 },
  train = { samples = 146484375, log_interval = 10, eval_interval = 1000, eval_iters = 40 },
  checkpoint = { dir = data_file "checkpoints/llama2_7b", interval = 1000 },
  log = { dir = data_file "logs/llama2_7b" },
}
