-- LLaMA-2 70B (80 layers, hidden 8192, 64 heads, 8 key/value groups, SwiGLU 28672, RoPE, RMSNorm,
-- untied output; 68.98B parameters) as the seeds run it: tp 4 x pp 4 with sequence parallelism
-- on 2 nodes of 8 H100s (dp 1), micro batch 1, global batch 2048, seq 4096, AdamW (0.9, 0.95),
-- lr 6e-5 cosine to 6e-6, clip 1.0, weight decay 0.1, LLaMA-2's SentencePiece tokenizer; bf16.
-- At dp 1 nothing shards the optimizer: its fp32 masters and moments alone take 52 GB of each GPU.
-- To fit 80 GB this recipe recomputes whole layers in backward (model.recompute = "full", as the
-- seeds' tuning advice says) and keeps gradients in bf16 (parallel.grad_reduce_dtype, Megatron's
-- --grad-reduce-in-bf16); without those two the dry run says 118.6 GB.
--
-- Submit (DATA_PATH as in the seeds, e.g. export DATA_PATH=/fsx/data):
--   sbatch slurm/train.sbatch recipes/llama2_70b.lua
-- Check the layout and the memory first, anywhere (no GPU, no data, no DATA_PATH needed):
--   megaengine --dry-run recipes/llama2_70b.lua --world 16
-- Expected memory per GPU (that dry run; GB = 10^9 bytes): pipeline stage 1 77.7 GB of 80 GB, of
-- which LibTorch's allocator peak is 71.9 GB (68,523 MiB: bf16 weights 8.7, bf16 main grads 8.7,
-- fp32 masters + AdamW state 52.1, the layer inputs of 4 micro-batches in flight 1.4); the last
-- stage 76.7 GB. On 32 GPUs (dp 2) the distributed optimizer (on here) halves the 52.1.
--
-- Data under $DATA_PATH/llama2/ (the seeds' layout): tokenizer.model, and my-llama2_text_document.bin/.idx:
--   megaengine preprocess --input $DATA_PATH/llama2/oscar-1GB.jsonl --output-prefix $DATA_PATH/llama2/my-llama2 \
--     --tokenizer sentencepiece --tokenizer-model $DATA_PATH/llama2/tokenizer.model --append-eod
--
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
  name = "llama2_70b",
  device = "cuda",
  precision = "bf16",
  model = me.presets.llama2["70b"] { seq = 4096, init_std = 0.006, recompute = "full" },
  data = me.data.gpt {
    prefix = data_file "llama2/my-llama2_text_document",
    split = "98,2,0",
    tokenizer = me.tokenizer.sentencepiece { model_file = data_file "llama2/tokenizer.model" },
  },
  batch = { micro = 1, global = 2048 },
  parallel = { tp = 4, pp = 4, sequence_parallel = true, distributed_optimizer = true, grad_reduce_dtype = "bf16" },
  optimizer = me.optim.adamw { lr = 6e-5, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 },
  -- The seeds' schedule in samples (as their GPT run; LLaMA's seed gives no length).
  schedule = me.schedule.cosine { min_lr = 6e-6, warmup_samples = 183105, decay_samples = 126953125 },
  train = { samples = 146484375, log_interval = 10, eval_interval = 1000, eval_iters = 40 },
  checkpoint = { dir = data_file "checkpoints/llama2_70b", interval = 1000 },
  log = { dir = data_file "logs/llama2_70b" },
}
