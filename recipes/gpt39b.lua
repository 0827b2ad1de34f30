-- GPT 39.1B: the 39.1B row of the user's Megatron size table (48 layers, hidden 8192, 64 heads),
-- trained as the seeds' "default 39B" run: tp 4 x pp 2 on 2 nodes of 8 H100s (so dp 2), micro
-- batch 1, global batch 288, seq 2048, Adam (0.9, 0.95), lr 6e-5 cosine to 6e-6, clip 1.0, weight
-- decay 0.1, by samples (146,484,375; decay 126,953,125; warmup 183,105), evaluation every 1000
-- iterations for 40, split 98,2,0, GPT-2's tokenizer; bf16 with the distributed optimizer.
--
-- Submit (DATA_PATH as in the seeds, e.g. export DATA_PATH=/fsx/data):
--   sbatch slurm/train.sbatch recipes/gpt39b.lua
-- Check the layout and the memory first, anywhere (no GPU, no data, no DATA_PATH needed):
--   megaengine --dry-run recipes/gpt39b.lua --world 16
-- Expected memory per GPU (that dry run; GB = 10^9 bytes): pipeline stage 1 77.0 GB of 80 GB,
-- of which LibTorch's allocator peak is 71.0 GB (67,729 MiB: bf16 weights 9.9, fp32 main grads
-- 19.8, masters + Adam state sharded over dp 2 29.7, activations of the 2 micro-batches in flight
-- 11.3) and CUDA context, NCCL and allocator slack the rest; stage 2 71.1 GB. Without the
-- distributed optimizer: 108.2 GB, too much. parallel.sequence_parallel=true: 74.4 GB.
--
-- Data under $DATA_PATH/gpt2/ (the seeds' layout): my-gpt2_text_document.bin/.idx, made by
--   megaengine preprocess --input $DATA_PATH/gpt2/oscar-1GB.jsonl --output-prefix $DATA_PATH/gpt2/my-gpt2 \
--     --tokenizer gpt2 --vocab-file $DATA_PATH/gpt2/gpt2-vocab.json --merge-file $DATA_PATH/gpt2/gpt2-merges.txt --append-eod
-- (or Megatron's preprocess_data.py: the same files), and GPT-2's gpt2-vocab.json, gpt2-merges.txt.
--
-- The seeds' variants, as overrides after the recipe:
--   benchmark mode (no evaluation):  train.eval_iters=0 data.split=100,0,0
--   iterations instead of samples:   train.samples=0 train.iters=50 schedule.decay_samples=0 schedule.warmup_samples=0
--                                    schedule.decay_iters=45 schedule.warmup_iters=2
--   another row of the size table:   recipes/gpt.lua (GPT_SIZE=18.4b)
local me = require "megaengine"

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
  name = "gpt39b",
  device = "cuda",
  precision = "bf16",
  model = me.presets.gpt["39.1b"] { seq = 2048, init_std = 0.006 },
  data = me.data.gpt {
    prefix = data_file "gpt2/my-gpt2_text_document",
    split = "98,2,0",
    tokenizer = me.tokenizer.gpt2 { vocab_file = data_file "gpt2/gpt2-vocab.json",
                                    merge_file = data_file "gpt2/gpt2-merges.txt" },
  },
  batch = { micro = 1, global = 288 },
  parallel = { tp = 4, pp = 2, distributed_optimizer = true },
  optimizer = me.optim.adamw { lr = 6e-5, betas = { 0.9, 0.95 }, weight_decay = 0.1, clip = 1.0 },
  schedule = me.schedule.cosine { min_lr = 6e-6, warmup_samples = 183105, decay_samples = 126953125 },
  train = { samples = 146484375, log_interval = 10, eval_interval = 1000, eval_iters = 40 },
  checkpoint = { dir = data_file "checkpoints/gpt39b", interval = 1000 },
  log = { dir = data_file "logs/gpt39b" },
}
