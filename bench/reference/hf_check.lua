-- megaengine's side of bench/reference/hf_check.sh (the check against transformers itself).
-- ME_HFC_MODE=train: a tiny GPT or LLaMA (ME_HFC_MODEL, GQA and RoPE for LLaMA) trained a few
--   steps on ME_HFC_DEVICE in ME_HFC_PRECISION, exported with me.hf.export(trainer, DIR/hf), and
--   its logits on the token ids of ME_HFC_TOKENS written to DIR/megaengine.safetensors.
-- ME_HFC_MODE=import: the random LlamaForCausalLM in ME_HFC_HF loaded through
--   checkpoint.load = "hf:DIR" (hidden 512, 8 heads, 2 query groups, 4 layers, vocab 32000):
--   its logits, the loss of the fixed batch (tokens[:, :-1] -> tokens[:, 1:]) and the global
--   norm of that loss's gradient written likewise.
-- ME_HFC_TEXT: a text file for the training data; ME_HFC_DIR: where everything goes.
local me = require "megaengine"
local mode, dir = os.getenv("ME_HFC_MODE"), assert(os.getenv("ME_HFC_DIR"), "set ME_HFC_DIR")
local device = os.getenv("ME_HFC_DEVICE") or "cuda"
local precision = os.getenv("ME_HFC_PRECISION") or "fp32"

-- Token ids as written by hf_check.py: a first line "B S", then B lines of S ids.
local function read_tokens(path)
  local f = assert(io.open(path, "r"), "cannot open " .. path)
  local b, s = f:read("n", "n")
  local rows = {}
  for i = 1, b do
    rows[i] = {}
    for j = 1, s do rows[i][j] = math.tointeger(f:read("n")) end
  end
  f:close()
  return me.tensor.from(rows):to(device)
end

local function recipe(model, extra)
  local r = {
    name = "hf_check", device = device, precision = precision, seed = 5, model = model,
    data = me.data.text { path = assert(os.getenv("ME_HFC_TEXT"), "set ME_HFC_TEXT") },
    batch = { micro = 4, global = 8 },
    optimizer = me.optim.adamw { lr = 3e-3 },
    schedule = me.schedule.constant { warmup_iters = 1 },
    train = { iters = 6, log_interval = 2, eval_iters = 0 },
  }
  for k, v in pairs(extra or {}) do r[k] = v end
  return me.recipe(r)
end

local tokens = read_tokens(assert(os.getenv("ME_HFC_TOKENS"), "set ME_HFC_TOKENS"))
local out = {}
if mode == "train" then
  local kind = os.getenv("ME_HFC_MODEL")
  local model = kind == "llama"
      and me.model.llama { vocab = 256, seq = 64, layers = 2, hidden = 128, heads = 8, query_groups = 2,
                           ffn_hidden = 352, vocab_divisible_by = 64, rope_base = 10000.0 }
      or me.model.gpt { vocab = 256, seq = 64, layers = 2, hidden = 128, heads = 4, vocab_divisible_by = 64 }
  local trainer = me.trainer(recipe(model))
  local summary = trainer:run()
  print(("hf_check %s %s: trained %d steps, loss %.4f -> %.4f"):format(kind, precision, summary.iterations,
    summary.first_loss, summary.last_loss))
  local r = me.hf.export(trainer, dir .. "/hf", { force = true })
  print(("hf_check %s %s: exported %s (%s, %d tensors)"):format(kind, precision, r.dir, r.dtype, r.tensors))
  out.logits = trainer:model():full_logits(tokens):narrow(3, 1, 256)
elseif mode == "import" then
  local model = me.model.llama { vocab = 32000, seq = 128, layers = 4, hidden = 512, heads = 8, query_groups = 2,
                                 ffn_hidden = 1408, norm_eps = 1e-5, rope_base = 10000.0 }
  local trainer = me.trainer(recipe(model, { checkpoint = { load = "hf:" .. assert(os.getenv("ME_HFC_HF")) } }))
  local loaded = trainer:model()
  local s = tokens:size(2)
  local input, labels = tokens:narrow(2, 1, s - 1), tokens:narrow(2, 2, s - 1)
  out.logits = loaded:full_logits(input):narrow(3, 1, 32000)  -- the padded rows are no tokens
  -- The training step's forward and backward on a plain model holding the loaded weights: the
  -- trainer's own model reports its gradients to the step's gradient buffer instead of .grad.
  local m = model:build(0):to(device)
  local from = loaded:parameters()
  for name, p in pairs(m:parameters()) do p:copy_(assert(from[name], "the loaded model has no " .. name)) end
  local loss = m:loss(input, labels)
  loss:backward()
  local sq = 0
  for _, g in pairs(m:gradients()) do sq = sq + (g:to("float64") * g:to("float64")):sum():item() end
  out.loss = loss:detach():to("float32"):reshape { 1 }
  out.grad_norm = me.tensor.from { math.sqrt(sq) }:to("float32")
  print(("hf_check import: loss %.6f, gradient norm %.6f"):format(out.loss:item(), math.sqrt(sq)))
else
  error("ME_HFC_MODE must be train or import")
end
for k, v in pairs(out) do out[k] = v:to("float32"):to("cpu") end
me.hf.save_tensors(dir .. "/megaengine.safetensors", out)
