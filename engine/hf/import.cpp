// Import: a transformers model directory, one table row at a time, into a checkpoint of weights
// alone; and checkpoint.load = "hf:DIR" for a run.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/hf/convert.h"
#include "engine/core/error.h"
#include "engine/core/files.h"
#include "engine/core/log.h"

namespace me::hf {

namespace {

// One table row with the Hugging Face tensors found (under the names the files use).
struct Input {
  TensorMap map;
  checkpoint::DType dtype = checkpoint::DType::F32;  // what our tensor is written as
};

// Finds and checks (dtype, shape) every tensor the model needs before anything is written.
std::vector<Input> find_inputs(HfWeights& w, const model::TransformerConfig& c, std::set<std::string>& used) {
  std::vector<Input> out;
  for (auto m : tensor_maps(c)) {
    std::set<checkpoint::DType> dtypes;
    for (size_t k = 0; k < m.hf.size(); ++k) {
      const checkpoint::SafetensorsFile* file = nullptr;
      const checkpoint::TensorEntry* e = nullptr;
      for (const auto& name : hf_name_variants(m.hf[k]))
        if (!e && (e = w.find(name, &file))) m.hf[k] = name;
      ME_CHECK(e, "the Hugging Face model '", w.dir(), "' has no tensor '", m.hf[k], "' (megaengine's ", m.ours,
               "): its weights are not the ", family_name(family_of(c)), " model its config.json describes");
      const auto d = e->dtype;
      ME_CHECK(d == checkpoint::DType::F32 || d == checkpoint::DType::BF16 || d == checkpoint::DType::F16 || d == checkpoint::DType::F64, "'", file->path(),
               "': tensor '", e->name, "' is ", checkpoint::dtype_name(d),
               "; only F32, BF16, F16 and F64 weights can be imported (a quantized model?)");
      auto want = m.hf_shapes[k];
      if (m.transform == Transform::position && !e->shape.empty() && e->shape[0] >= want[0]) want[0] = e->shape[0];
      ME_CHECK(e->shape == want, "'", file->path(), "': tensor '", e->name, "' is ", checkpoint::shape_text(e->shape),
               ", config.json makes it ", checkpoint::shape_text(want));
      dtypes.insert(d == checkpoint::DType::F64 ? checkpoint::DType::F32 : d);
      used.insert(e->name);
    }
    out.push_back({m, dtypes.size() == 1 ? *dtypes.begin() : checkpoint::DType::F32});
  }
  return out;
}

// The layer indices of the weight files ("h.3." in GPT-2's names, "layers.3." in LLaMA's), as
// one past the largest; -1 when no name has one.
int64_t layers_in(const std::vector<std::string>& names) {
  int64_t most = -1;
  for (const auto& name : names)
    for (const char* tag : {"h.", "layers."}) {
      const auto at = name.find(tag);
      if (at == std::string::npos || (at > 0 && name[at - 1] != '.')) continue;
      const auto start = at + std::char_traits<char>::length(tag), dot = name.find('.', start);
      if (dot == std::string::npos || dot == start || dot - start > 9 ||
          name.find_first_not_of("0123456789", start) != dot)
        continue;
      most = std::max<int64_t>(most, std::stoll(name.substr(start, dot - start)) + 1);
    }
  return most;
}

// config.json against the weight files, before anything is made in proportion to the config: a
// layer count of 10^7 would otherwise allocate that many tensor tables (std::bad_alloc).
void check_layers(const model::TransformerConfig& c, const std::vector<std::string>& names, const std::string& config,
                  const std::string& dir) {
  const char* field = family_of(c) == Family::llama ? "num_hidden_layers" : "n_layer";
  const int64_t found = layers_in(names);
  ME_CHECK(found > 0, "'", config, "' gives ", field, " = ", c.layers, ", but the weight files of '", dir,
           "' hold no numbered layers: they are not the model its config.json describes");
  ME_CHECK(found == c.layers, "'", config, "': ", field, " is ", c.layers, ", but the weight files of '", dir,
           "' hold ", found, " layers (0 .. ", found - 1, "): fix ", field, " in config.json, or give the weights it ",
           "describes");
}

const char* precision_of(checkpoint::DType d) { return d == checkpoint::DType::BF16 ? "bf16" : d == checkpoint::DType::F16 ? "fp16" : "fp32"; }

// The recipe recorded in the checkpoint: the model, and the tokenizer files found next to it.
std::string import_recipe(const model::TransformerConfig& c, const std::string& hf_dir, const std::string& name,
                          checkpoint::DType dtype) {
  config::Recipe spec;
  spec.name = name.empty() ? "hf:" + files::real_path(hf_dir) : name;
  spec.model = c;
  spec.precision = precision_of(dtype);
  const auto dir = files::real_path(hf_dir);
  auto& t = spec.data.tokenizer;
  if (files::exists(files::join(dir, "vocab.json")) && files::exists(files::join(dir, "merges.txt"))) {
    t.kind = "gpt2";
    t.vocab_file = files::join(dir, "vocab.json");
    t.merge_file = files::join(dir, "merges.txt");
  } else if (files::exists(files::join(dir, "tokenizer.model"))) {
    t.kind = "sentencepiece";
    t.model_file = files::join(dir, "tokenizer.model");
  }
  return checkpoint::recipe_to_json(spec);
}

checkpoint::Metadata import_metadata(const model::TransformerConfig& c, const std::vector<WrittenFile>& written,
                         const std::vector<PlannedTensor>& planned, std::string recipe, checkpoint::DType dtype) {
  checkpoint::Metadata m;
  m.vocab = c.vocab;
  m.recipe_json = std::move(recipe);
  m.layout.stage_layers = {c.layers};
  m.layout.precision = precision_of(dtype);
  std::map<std::string, const PlannedTensor*> by_name;
  for (const auto& p : planned) by_name[p.name] = &p;
  for (size_t i = 0; i < written.size(); ++i) {
    const auto& f = written[i];
    m.shards[f.name] = {static_cast<int>(i), f.result.bytes, f.result.crc32c};
    for (const auto& name : f.tensors) {
      const auto& p = *by_name.at(name);
      const auto numel = static_cast<int64_t>(p.bytes() / checkpoint::dtype_size(p.dtype));
      m.tensors[name] = {checkpoint::dtype_name(p.dtype), p.shape, {{f.name, name, -1, 0, 0, 0, numel}}};
    }
  }
  return m;
}

std::vector<std::string> part_names(size_t count) {
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "part_%05zu.safetensors", i);
    out.push_back(name);
  }
  return out;
}

}  // namespace

ImportResult import_hf(const std::string& hf_dir, const std::string& checkpoint_dir, const ImportOptions& options) {
  const auto config_path = files::join(hf_dir, "config.json");
  ME_CHECK(files::exists(config_path), "'", hf_dir, "' has no config.json: it is not a Hugging Face model directory");
  ImportResult r;
  r.config = config_from_json(checkpoint::read_file(config_path), config_path);
  if (options.expected) {
    check_matches(r.config, *options.expected, config_path);
    r.config = *options.expected;  // the same model, with the recipe's training fields (seq, padding...)
  }
  const auto& c = r.config;
  HfWeights weights(hf_dir);
  check_layers(c, weights.names(), config_path, hf_dir);
  std::set<std::string> used;
  const auto inputs = find_inputs(weights, c, used);
  for (const auto& name : weights.names())
    if (!used.count(name) && !ignorable_hf_tensor(name, c)) r.unused.push_back(name);
  checkpoint::CheckpointDir dir(checkpoint_dir);
  ME_CHECK(!files::exists(checkpoint_dir) || !dir.latest(), "import: '", checkpoint_dir,
           "' already holds a checkpoint: import into a new directory");
  std::vector<PlannedTensor> planned;
  std::set<checkpoint::DType> dtypes;
  for (const auto& in : inputs) {
    planned.push_back({"model." + in.map.ours, in.dtype, in.map.shape});
    dtypes.insert(in.dtype);
  }
  const checkpoint::DType dtype = dtypes.size() == 1 ? *dtypes.begin() : checkpoint::DType::F32;
  const auto plan = plan_shards(planned, options.max_shard_bytes);
  const std::string tmp = dir.begin(0, checkpoint::random_nonce());
  try {
    ShardWriter writer(tmp, plan, part_names(plan.size()), {{"format", "megaengine-checkpoint-shard"}}, true);
    for (const auto& in : inputs) {
      std::vector<torch::Tensor> hf;
      for (const auto& name : in.map.hf) hf.push_back(weights.read(name).to(checkpoint::scalar_type_of(in.dtype)));
      writer.write("model." + in.map.ours, from_hf(in.map, hf, c));
    }
    const auto written = writer.finish();
    const auto meta = import_metadata(c, written, planned, import_recipe(c, hf_dir, options.name, dtype), dtype);
    checkpoint::write_file_atomic(files::join(tmp, checkpoint::kMetadataFile), meta.to_json());
    ME_CHECK(dir.commit(0, tmp), "import: '", dir.iteration_path(0), "' appeared while importing");
  } catch (...) {
    files::remove_tree(tmp);
    throw;
  }
  for (const auto& p : planned) r.bytes += p.bytes();
  r.tensors = static_cast<int64_t>(planned.size());
  r.iteration_dir = dir.iteration_path(0);
  return r;
}

std::string import_hf(const std::string& hf_dir, const model::TransformerConfig& expected, const std::string& out_dir) {
  ImportOptions o;
  o.expected = &expected;
  const auto r = import_hf(hf_dir, out_dir, o);
  if (!r.unused.empty())
    log::warn("import: ", r.unused.size(), " tensors of ", hf_dir, " have no place in the model (first: ", r.unused[0], ")");
  return r.iteration_dir;
}

}  // namespace me::hf
