-- me.hf from Lua: config(model) for LLaMA (GQA) and GPT; export of a trainer and of a checkpoint
-- directory give the same files; import checked against a model table (a mismatch lists the
-- fields) gives a checkpoint whose logits are the trainer's.
local me = require "megaengine"
local tmp = io.popen("mktemp -d"):read("l")
local function cleanup() os.execute("rm -rf '" .. tmp .. "'") end

local function read(path)
  local f = assert(io.open(path, "rb"), "cannot open " .. path)
  local s = f:read("a")
  f:close()
  return s
end

local ok, err = pcall(function()
  local llama = me.model.llama { vocab = 300, vocab_divisible_by = 64, seq = 32, layers = 2, hidden = 64, heads = 4,
                                 query_groups = 2, ffn_hidden = 96, rope_base = 5000.0 }
  local config = me.hf.config(llama)
  for _, want in ipairs { '"model_type": "llama"', '"num_key_value_heads": 2', '"vocab_size": 300',
                          '"rope_theta": 5000.0', '"intermediate_size": 96', '"architectures": %[\n    "LlamaForCausalLM"' } do
    assert(config:find(want), "me.hf.config(llama) lacks " .. want .. ":\n" .. config)
  end
  local gpt = me.hf.config(me.model.gpt { vocab = 256, seq = 32, layers = 2, hidden = 64, heads = 4 })
  assert(gpt:find('"activation_function": "gelu_new"') and gpt:find('"n_positions": 32'), gpt)

  local recipe = function(extra)
    local r = { name = "hf_lua", seed = 3, model = llama, data = me.data.text { path = me.asset "moby-dick.txt" },
                batch = { micro = 2, global = 4 }, optimizer = me.optim.adamw { lr = 3e-3 },
                schedule = me.schedule.constant { warmup_iters = 1 }, train = { iters = 3, eval_iters = 0, log_interval = 10 } }
    for k, v in pairs(extra or {}) do r[k] = v end
    return me.recipe(r)
  end
  local trainer = me.trainer(recipe())
  trainer:run()
  local from_trainer = me.hf.export(trainer, tmp .. "/hf")
  assert(from_trainer.family == "llama" and from_trainer.dtype == "float32" and from_trainer.tensors == 21,
         ("export result: %s %s %d tensors"):format(from_trainer.family, from_trainer.dtype, from_trainer.tensors))
  trainer:save(tmp .. "/ckpt")
  local from_dir = me.hf.export(tmp .. "/ckpt", tmp .. "/hf2")
  for _, f in ipairs(from_dir.files) do
    assert(read(tmp .. "/hf/" .. f) == read(tmp .. "/hf2/" .. f), f .. " differs between the trainer's and the checkpoint's export")
  end

  local bad = me.model.llama { vocab = 300, vocab_divisible_by = 64, seq = 32, layers = 2, hidden = 96, heads = 4,
                               query_groups = 2, ffn_hidden = 96, rope_base = 5000.0 }
  local refused, message = pcall(me.hf.import, tmp .. "/hf", tmp .. "/bad", bad)
  assert(not refused and tostring(message):find("model.hidden: 96 in the recipe, 64 in config.json %(hidden_size%)"),
         "a mismatching model was not refused as expected: " .. tostring(message))

  local iteration = me.hf.import(tmp .. "/hf", tmp .. "/imported", llama)
  local loaded = me.trainer(recipe { checkpoint = { load = iteration } })
  local tokens = me.tensor.randint(0, 300, { 2, 16 })
  local a = trainer:model():full_logits(tokens):narrow(3, 1, 300)
  local b = loaded:model():full_logits(tokens):narrow(3, 1, 300)
  local diff = (a - b):abs():max():item()
  assert(diff == 0, "logits after export and import differ by " .. diff)
  print(("test_hf passed: config, export (trainer and directory, %d files), import, logits equal"):format(#from_dir.files))
end)
cleanup()
if not ok then error(err, 0) end
