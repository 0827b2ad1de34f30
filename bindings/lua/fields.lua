-- Every recipe field: its default and one line of help, beside each other. This is the one
-- source of defaults: the constructors (me.recipe, me.model.gpt, me.optim.adamw, ...), the
-- override parser, `megaengine --fields` and help() read it; the C++ side reads values only
-- (bindings/lua/lua_recipe.cpp), so nothing here is declared twice.
--
-- A section is an ordered list of { name, default, help [, type] }; type defaults to the
-- default's Lua type (integer, number, boolean, string). Real-valued fields have real
-- defaults (25.0, not 25): an override's type follows the default.
local F = { sections = {} }

local function section(name, fields, doc)
  local s = { name = name, fields = fields, doc = doc }
  F.sections[#F.sections + 1] = s
  F[name] = s
  return s
end

-- A section built from another one with some defaults replaced (the model families, the
-- schedule kinds): the fields and their help stay in one place.
local function variant(name, base, defaults, doc)
  local fields = {}
  for i, f in ipairs(base.fields) do
    local d = defaults[f[1]]
    if d == nil then d = f[2] end
    fields[i] = { f[1], d, f[3], f[4] }
  end
  local s = section(name, fields, doc)
  s.variant_of = base
  return s
end

section("recipe", {
  { "name", "run", "the run's name, in its log lines and checkpoints" },
  { "device", "cpu", "cpu, cuda or cuda:N (each rank takes its local GPU under several ranks)" },
  { "seed", 1234, "seeds the weights, the data order and sampling; the same seed gives the same run at every layout" },
  { "precision", "fp32", "fp32 | bf16 (bf16 weights and activations, fp32 masters) | fp16 (adds loss scaling) | fp8 (bf16, the transformer blocks' linear layers' GEMMs in fp8: E4M3 weights and activations, E5M2 gradients; Hopper GPUs)" },
  { "fp8_scaling", "delayed", "precision = fp8: delayed (each tensor's scale from the largest amax of its last fp8_amax_history casts; no extra pass) | current (from the tensor's own amax: one more pass over it)" },
  { "fp8_amax_history", 16, "precision = fp8, delayed scaling: casts of amax history per tensor" },
  { "fp8_margin", 0, "precision = fp8: scales leave 2^margin of headroom below the format's largest value" },
  { "model", false, "the model: me.model.gpt{...} or me.model.llama{...}", "model" },
  { "data", false, "the data: me.data.gpt{...} (Megatron .bin/.idx) or me.data.text{...} (bytes of a file)", "data" },
  { "optimizer", false, "me.optim.adamw{...} (the default) or me.optim.sgd{...}", "optimizer" },
  { "schedule", false, "me.schedule.cosine{...} (the default), constant, linear, inverse_sqrt or wsd", "schedule" },
  { "on_log", false, "function(record) called at every log interval with the progress line's numbers", "function" },
}, "the top level of `me.recipe { ... }`; each table-valued section below has its own fields")

-- The engine's TransformerConfig, with GPT's defaults; LLaMA's differ where noted below.
local model = section("model", {
  { "kind", "gpt", "gpt | llama: the family whose defaults fill the other fields" },
  { "vocab", 256, "the tokenizer's vocabulary; padded to a multiple of vocab_divisible_by x tp" },
  { "seq", 128, "sequence length in tokens" },
  { "layers", 4, "transformer layers" },
  { "hidden", 128, "hidden size" },
  { "heads", 4, "attention heads" },
  { "query_groups", 0, "key/value heads for grouped-query attention; 0: as many as heads" },
  { "ffn_hidden", 0, "MLP width; 0: the family's rule (4 x hidden; LLaMA: 2/3 x 4 x hidden x ffn_multiplier, rounded)" },
  { "ffn_multiplier", 1.0, "LLaMA's ffn_dim_multiplier (1.3 for 70B)" },
  { "ffn_multiple_of", 256, "LLaMA rounds the MLP width up to a multiple of this" },
  { "vocab_divisible_by", 128, "the vocabulary is padded to a multiple of this x tp, as Megatron does" },
  { "norm", "layernorm", "layernorm | rmsnorm" },
  { "activation", "gelu", "gelu (tanh form) | swiglu" },
  { "position", "learned", "learned position embeddings | rope" },
  { "bias", true, "biases in the linear layers and norms" },
  { "tie_embeddings", true, "the output layer shares the word embedding's weight" },
  { "norm_eps", 1e-5, "epsilon of the norms" },
  { "rope_base", 10000.0, "RoPE's base (theta)" },
  { "init_std", 0.02, "weights ~ N(0, init_std); residual output projections use init_std / sqrt(2 x layers)" },
  { "recompute", "none", "none | selective (the attention core) | full (whole layers): compute traded for memory" },
  { "recompute_every", 1, "with recompute = full: every k-th layer" },
}, "me.model.gpt{...} and me.model.llama{...}")
F.model_families = {
  gpt = variant("model.gpt", model, {}, "me.model.gpt{...}: learned positions, LayerNorm, GeLU, biases, tied embeddings"),
  llama = variant("model.llama", model, { kind = "llama", vocab = 32000, norm = "rmsnorm", activation = "swiglu",
                                         position = "rope", bias = false, tie_embeddings = false },
                  "me.model.llama{...}: RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, untied output"),
}

section("data.text", {
  { "kind", "text", "text: the bytes of one file, each byte a token (no tokenizer)" },
  { "path", "", "the text file (required)" },
  { "holdout", 0.05, "the share of the file held out for validation" },
}, "me.data.text{...}: a byte-level dataset that needs no preprocessing")
section("data.gpt", {
  { "kind", "gpt", "gpt: Megatron's .bin/.idx datasets and GPT sample index" },
  { "prefix", "", "one dataset: the path of its .bin/.idx without the extension" },
  { "blend", {}, "several datasets: { {weight, prefix}, ... } (instead of prefix)", "table" },
  { "split", "969,30,1", "train, validation and test shares of the documents, as Megatron's --split" },
  { "cache_dir", "", "where the sample-index caches go; empty: next to the data" },
  { "eod_mask_loss", false, "no loss where the input token is end-of-document" },
  { "tokenizer", false, "me.tokenizer.gpt2{} or me.tokenizer.sentencepiece{...}: for source and samples", "tokenizer" },
  { "source", "", "a text or jsonl file preprocessed into prefix when that is missing or older" },
  { "source_format", "text", "text (a document per blank-line separated paragraph) | jsonl" },
  { "json_key", "text", "the jsonl field holding the document" },
}, "me.data.gpt{...}: Megatron-compatible data")
section("tokenizer.gpt2", {
  { "kind", "gpt2", "GPT-2's byte-level BPE" },
  { "vocab_file", "", "encoder.json / vocab.json; empty: the fetched assets" },
  { "merge_file", "", "vocab.bpe / merges.txt; empty: the fetched assets" },
}, "me.tokenizer.gpt2{...}")
section("tokenizer.sentencepiece", {
  { "kind", "sentencepiece", "SentencePiece (LLaMA's tokenizer.model)" },
  { "model_file", "", "the tokenizer.model file (required)" },
}, "me.tokenizer.sentencepiece{...}")

section("optimizer.adamw", {
  { "kind", "adamw", "AdamW with decoupled weight decay, fp32 master weights" },
  { "lr", 1e-3, "the peak learning rate (the schedule's maximum)" },
  { "betas", { 0.9, 0.95 }, "{beta1, beta2}", "table" },
  { "eps", 1e-8, "Adam's epsilon" },
  { "weight_decay", 0.1, "decoupled weight decay of matrices (not of biases and norms)" },
  { "clip", 1.0, "clip gradients to this global norm; 0: no clipping" },
}, "me.optim.adamw{...}")
section("optimizer.sgd", {
  { "kind", "sgd", "SGD with momentum" },
  { "lr", 1e-2, "the peak learning rate" },
  { "momentum", 0.9, "momentum" },
  { "weight_decay", 0.0, "weight decay of matrices" },
  { "clip", 1.0, "clip gradients to this global norm; 0: no clipping" },
}, "me.optim.sgd{...}")

local schedule = section("schedule", {
  { "kind", "cosine", "constant | linear | cosine | inverse-square-root | wsd" },
  { "warmup_iters", 0, "linear warm-up from 0 over this many iterations" },
  { "decay_iters", 0, "the iteration where decay ends at min_lr; 0: train.iters" },
  { "min_lr", 0.0, "the learning rate after decay" },
  { "wsd_decay_iters", 0, "wsd: the length of the final linear anneal" },
  { "warmup_samples", 0, "warm-up in samples (Megatron's --lr-warmup-samples); any *_samples > 0 counts the schedule in samples" },
  { "decay_samples", 0, "decay in samples (--lr-decay-samples); 0: the whole run" },
  { "wsd_decay_samples", 0, "wsd's anneal in samples" },
}, "me.schedule.<kind>{...}")
F.schedule_kinds = {}
for _, kind in ipairs({ "constant", "linear", "cosine", "inverse_sqrt", "wsd" }) do
  F.schedule_kinds[kind] = variant("schedule." .. kind, schedule,
    { kind = kind == "inverse_sqrt" and "inverse-square-root" or kind }, "me.schedule." .. kind .. "{...}")
end

section("batch", {
  { "micro", 8, "samples per micro-batch on each data-parallel rank" },
  { "global", 0, "samples per step = micro x dp x accumulation steps; 0: micro x dp (no accumulation)" },
}, "recipe.batch")
section("parallel", {
  { "tp", 1, "tensor-parallel size: each layer split over this many GPUs (keep it inside a node)" },
  { "pp", 1, "pipeline-parallel size: the layers cut into this many stages, run in 1F1B order" },
  { "pp_first_layers", 0, "layers of the first pipeline stage (it also holds the embedding); 0: an even share" },
  { "pp_last_layers", 0, "layers of the last stage (it also holds the output layer); 0: an even share" },
  { "pp_split", "even", "even | balanced (the first and last stages' layers chosen from the model's FLOPs)" },
  { "pp_deferred_wgrads", 1, "micro-batches of weight gradients a stage holds back into its idle time; 0: plain 1F1B" },
  { "sequence_parallel", false, "split norms, dropout and the residual stream over the tokens across tp (needs tp > 1 to matter)" },
  { "distributed_optimizer", false, "ZeRO-1: masters and optimizer state sharded over data parallelism" },
  { "bucket_mb", 25.0, "gradient bucket size in MiB; each bucket is reduced as soon as backward fills it" },
  { "grad_accumulation_fusion", true, "weight-gradient GEMMs write straight into the main-grad buffer" },
  { "tp_comm_overlap", true, "tensor-parallel collectives run beside the GEMMs (a side stream on the GPU)" },
  { "tp_comm_sm_margin", 0, "multiprocessors the GEMMs leave free while a TP collective runs beside them" },
  { "overlap_param_gather", true, "distributed optimizer: parameter all-gathers overlap the next forward" },
  { "symmetric_buffers", "none", "none | params | all: data-parallel buffers registered as NCCL symmetric windows" },
  { "grad_reduce_dtype", "fp32", "fp32 | bf16 (with precision = bf16): the dtype gradients accumulate and reduce in" },
  { "tp_symmetric_mb", 0.0, "MiB of activation buffers registered for the sequence-parallel all-gathers; 0: off" },
  { "tp_comm_backend", "auto", "auto | nccl | copy_engine: what moves the overlapped sequence-parallel collectives (copy_engine: GPU copies over NVLink, no SMs taken from the GEMMs; one node); auto: the copy engines on CUDA with tp > 1, sequence_parallel and tp_comm_overlap (NCCL if they cannot be mapped), else NCCL" },
  { "tp_gather", "bulk", "bulk | ring: NCCL's overlapped sequence-parallel all-gathers as one collective beside the GEMM of this rank's rows (bulk), or as tp - 1 exchanges, each peer's rows multiplied as they arrive (ring; slower at tp 4 on H100)" },
  { "tp_delay_wgrad", true, "under sequence parallelism with tp_comm_overlap: each linear layer's weight-gradient GEMM runs beside backward's next TP collective (its all-gather then hides behind a whole GEMM; the input-gradient GEMM runs unsplit); false: all-gathers beside the input-gradient GEMM split per rank" },
  { "tp_wgrad_stream", false, "with tp_delay_wgrad: the held weight-gradient GEMMs run on a stream of their own, so that backward's work after each reduce-scatter (its sum, the norm backward, the copies) runs beside them; measured 1-4.5% faster a layer at the GPT-39B width, tp 4 + SP, and 0.6-5% slower at LLaMA-2-70B's; no effect under pipeline parallelism, whose schedule holds the weight gradients back itself (bench/RESULTS.md, twenty-eighth and twenty-ninth sessions)" },
  { "auto", false, "choose tp, pp, sequence_parallel, model.recompute, batch.micro and distributed_optimizer for the job's GPUs at start (megaengine plan); parallel = \"auto\" sets it" },
}, "recipe.parallel: the layout; dp is what is left of the world (world / (tp x pp))")
section("comm", {
  { "backend", "auto", "auto (nccl on cuda, gloo on cpu) | nccl | gloo" },
  { "timeout_s", 600.0, "a collective that takes longer ends the job, naming the rank that did not arrive" },
  { "rendezvous_timeout_s", 300.0, "how long the ranks wait for each other at the start (saying who is missing)" },
  { "heartbeat_s", 1.0, "how often each rank publishes its heartbeat and progress" },
  { "dead_after_s", 60.0, "a rank whose heartbeat is silent this long is dead: the job ends, naming it; 0: off" },
  { "nccl_cta_policy", "default", "default | efficiency | zero: NCCL's thread-block policy for every communicator" },
  { "cpu_bind", "gpu", "gpu: each GPU rank's threads on the CPUs local to its GPU (within any Slurm binding) | none" },
}, "recipe.comm: the communicators")
section("train", {
  { "iters", 100, "optimizer steps to train" },
  { "samples", 0, "> 0: train this many samples instead (iters = samples / global batch, rounded up)" },
  { "log_interval", 10, "iterations between progress lines" },
  { "eval_interval", 0, "iterations between evaluations; 0: only at the end" },
  { "eval_iters", 10, "validation batches per evaluation; 0: no evaluation (benchmark mode)" },
  { "peak_tflops", 0.0, "the GPU's bf16 peak, for MFU in the progress line; 0: no MFU" },
  { "profile_phases", false, "synchronise between a step's phases and log where the time goes (slower)" },
  { "profile_at", 0, "> 0: a kernel profile of the iterations from this one" },
  { "profile_steps", 3, "iterations the kernel profile covers" },
  { "profile_trace", "", "where the profile's Chrome trace goes (one per rank); empty: none" },
  { "exit_interval", 0, "stop (saving a checkpoint when checkpoint.dir is set) at iterations divisible by this; 0: never" },
  { "nan_policy", "skip", "skip (a step with a non-finite gradient is skipped and counted) | stop (after max_consecutive_nan in a row)" },
  { "max_consecutive_nan", 3, "with nan_policy = stop: consecutive non-finite steps that stop the run (saving first)" },
  { "straggler_factor", 1.5, "name the slowest rank when its own step time exceeds the median over ranks by this factor; 0: off" },
  { "deterministic", false, "bit-identical runs and resumes on the GPU: fixed reduction orders (cuBLAS, NCCL, attention), a nondeterministic op an error" },
  { "cuda_graphs", false, "each transformer block's forward and backward as CUDA graphs from the second step: far less host work per step, for runs their host paces (pp = 1, not fp8; tp > 1 with sequence parallelism on the copy engines)" },
}, "recipe.train: how long, and what to log")
section("sample", {
  { "prompt", "\n", "the text a sample starts from" },
  { "tokens", 0, "tokens sampled at the end of the run; 0: no sample" },
  { "top_k", 1, "sample among the k likeliest tokens (1: greedy)" },
  { "temperature", 1.0, "softmax temperature of the sampling" },
}, "recipe.sample: text generated at the end of the run; trainer:sample{} takes the same fields")
section("checkpoint", {
  { "dir", "", "where checkpoints go (Megatron's --save); a run whose dir holds one resumes from it; empty: no saving" },
  { "interval", 0, "iterations between saves (--save-interval); 0: only at the end, on a signal or exit_interval" },
  { "keep", 0, "committed checkpoints kept, the oldest deleted after a newer one commits; 0: keep all" },
  { "async", true, "write in the background after copying to host memory (the copy is the only pause)" },
  { "load", "", "start from this checkpoint (a directory or an iter_N in it) when dir holds none (--load); \"hf:DIR\": Hugging Face weights" },
  { "save_on_exit", true, "save at the end of the run (and when stopped by SIGTERM, SIGUSR1 or a first Ctrl-C) when dir is set" },
  { "weights_only", false, "with load: take its model weights alone (a model that differs is allowed where the shapes fit): a fresh optimizer, iteration 0, the data from its start" },
  { "override_schedule", false, "on resume, follow the recipe's learning-rate schedule (train.iters, schedule.*, optimizer.lr) instead of the checkpoint's (Megatron's --override-opt_param-scheduler)" },
  { "iteration", 0, "resume from this saved iteration of dir (or of load) instead of the latest, e.g. an earlier one when the latest is damaged; 0: the latest" },
}, "recipe.checkpoint: sharded, atomic, resumable saves; Megatron's --save/--load/--save-interval")
section("log", {
  { "level", "info", "trace | debug | info | warn | error | off (ME_LOG_LEVEL wins)" },
  { "dir", "", "rank 0 writes DIR/tensorboard/events.out.tfevents.* and DIR/metrics.jsonl; \"\": none" },
}, "recipe.log")

-- { name = default } of a section. The table remembers its section (F.section_of), so a
-- constructor built from it can say which fields it takes (help() in the REPL).
local section_of_defaults = setmetatable({}, { __mode = "k" })
function F.defaults(name)
  local s = assert(F[name], "no field section " .. tostring(name))
  local out = {}
  for _, f in ipairs(s.fields) do out[f[1]] = f[2] end
  section_of_defaults[out] = name
  return out
end

-- The section name a table from F.defaults came from, or nil.
function F.section_of(defaults) return section_of_defaults[defaults] end

function F.type_of(f)
  if f[4] then return f[4] end
  local v = f[2]
  if math.type(v) == "integer" then return "integer" end
  return type(v)
end

local function show(v)
  if type(v) == "string" then return (("%q"):format(v):gsub("\\\n", "\\n")) end
  if type(v) == "table" then
    local parts = {}
    for i, x in ipairs(v) do parts[i] = show(x) end
    return "{ " .. table.concat(parts, ", ") .. (#parts > 0 and " }" or "}")
  end
  return tostring(v)
end

-- The reference text of every section named `which` or below it ("parallel", "model",
-- "optimizer.adamw"; nil: all): each field with its type, default and help. A variant (a model
-- family, a schedule kind) lists only the defaults that differ from its base.
local function field_line(f, help)
  local line = ("  %-26s %-9s %-12s %s"):format(f[1], F.type_of(f), show(f[2]), help or "")
  return (line:gsub("%s+$", ""))
end

function F.describe(which)
  local out = {}
  for _, s in ipairs(F.sections) do
    if which == nil or s.name == which or s.name:sub(1, #which + 1) == which .. "." then
      out[#out + 1] = ("%s -- %s"):format(s.name, s.doc or "")
      for i, f in ipairs(s.fields) do
        local base = s.variant_of and s.variant_of.fields[i]
        if not base or show(base[2]) ~= show(f[2]) then out[#out + 1] = field_line(f, not base and f[3] or nil) end
      end
      out[#out + 1] = ""
    end
  end
  if #out == 0 then
    local names = {}
    for _, s in ipairs(F.sections) do names[#names + 1] = s.name end
    error(("no recipe section '%s'; sections: %s"):format(which, table.concat(names, ", ")), 0)
  end
  return table.concat(out, "\n")
end

-- Every field of the one section `name`, each with its type, default and help (a variant in
-- full, unlike F.describe): what help(me.model.gpt) prints. Nil when there is no such section.
function F.reference(name)
  local s = F[name]
  if type(s) ~= "table" or not s.fields then return nil end
  local out = { ("%s -- %s"):format(s.name, s.doc or "") }
  for _, f in ipairs(s.fields) do out[#out + 1] = field_line(f, f[3]) end
  return table.concat(out, "\n")
end

-- The sections whose fields a recipe table holds directly (recipe.parallel.tp, ...).
F.recipe_sections = { "batch", "parallel", "comm", "train", "sample", "checkpoint", "log" }

return F
