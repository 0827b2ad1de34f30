// Export: our tensors, one at a time, through hf_mapping's tables into a transformers model
// directory.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/dir_guard.h"
#include "engine/hf/convert.h"
#include "engine/core/build_config.h"
#include "engine/core/error.h"
#include "engine/core/files.h"
#if ME_HAVE_TOKENIZERS
#include "engine/data/tokenizer.h"
#endif

namespace me::hf {

namespace {

struct DTypeName {
  const char* option;  // --dtype
  const char* config;  // config.json's torch_dtype
  torch::ScalarType type;
};
constexpr DTypeName kDTypes[] = {{"fp32", "float32", torch::kFloat},
                                 {"bf16", "bfloat16", torch::kBFloat16},
                                 {"fp16", "float16", torch::kHalf}};

const DTypeName& dtype_named(const std::string& option, torch::ScalarType model) {
  for (const auto& d : kDTypes)
    if (option.empty() ? d.type == model : option == d.option) return d;
  if (option.empty()) fail("export: the model's weights are ", c10::toString(model), ", which transformers models are not");
  fail("export: --dtype must be fp32, bf16 or fp16, got '", option, "'");
}

// Our tensor must be the shape the recipe's model gives it (the padded vocabulary: at least the real one).
void check_shape(const TensorMap& m, const torch::Tensor& t, const WeightSource& source) {
  auto want = m.shape;
  const auto got = t.sizes().vec();
  if (m.transform == Transform::vocab_rows && !got.empty() && got[0] >= want[0]) want[0] = got[0];
  ME_CHECK(got == want, source.describe(), ": tensor '", m.ours, "' is ", checkpoint::shape_text(got), ", the recipe's model makes it ",
           checkpoint::shape_text(want), ": the weights are not of the model the recipe describes");
}

void write_text(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ME_CHECK(f, "cannot create '", path, "'");
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ME_CHECK(std::fclose(f) == 0 && ok, "cannot write '", path, "'");
}

void copy_file(const std::string& from, const std::string& to) { write_text(to, checkpoint::read_file(from)); }

struct TokenIds {
  int64_t bos = -1, eos = -1;
};

// The recipe's tokenizer files under transformers' names, with its end-of-document id.
TokenIds write_tokenizer(const config::Recipe& spec, const std::string& dir, ExportResult& r) {
  const auto& t = spec.data.tokenizer;
  nlohmann::json config = {{"model_max_length", spec.model.seq}};
  TokenIds ids;
  if (t.kind.empty()) {
    r.notes.push_back("no tokenizer files: the recipe has no tokenizer (data.kind = '" + spec.data.kind +
                      "': its tokens are bytes)");
    return ids;
  }
  const std::vector<std::string> needed = t.kind == "gpt2" ? std::vector<std::string>{t.vocab_file, t.merge_file}
                                                           : std::vector<std::string>{t.model_file};
  for (const auto& f : needed)
    if (!files::exists(f)) {
      r.notes.push_back("no tokenizer files: the recipe's tokenizer file '" + f + "' is not there any more");
      return ids;
    }
#if ME_HAVE_TOKENIZERS
  try {
    ids.eos = data::make_tokenizer(t)->eod();
  } catch (const std::exception& e) {
    r.notes.push_back(std::string("no eos_token_id: the tokenizer cannot be loaded here (") + e.what() + ")");
  }
#endif
  if (t.kind == "gpt2") {
    copy_file(t.vocab_file, files::join(dir, "vocab.json"));
    copy_file(t.merge_file, files::join(dir, "merges.txt"));
    config.update({{"tokenizer_class", "GPT2Tokenizer"}, {"bos_token", "<|endoftext|>"},
                   {"eos_token", "<|endoftext|>"}, {"unk_token", "<|endoftext|>"}, {"add_prefix_space", false}});
    ids.bos = ids.eos;
    r.files.insert(r.files.end(), {"vocab.json", "merges.txt"});
  } else {
    copy_file(t.model_file, files::join(dir, "tokenizer.model"));
    config["tokenizer_class"] = "LlamaTokenizer";
    r.files.push_back("tokenizer.model");
  }
  write_text(files::join(dir, "tokenizer_config.json"), config.dump(2) + "\n");
  r.files.push_back("tokenizer_config.json");
  return ids;
}

void write_index(const std::string& dir, const std::vector<WrittenFile>& written, uint64_t total) {
  nlohmann::json j = {{"metadata", {{"total_size", total}}}, {"weight_map", nlohmann::json::object()}};
  for (const auto& f : written)
    for (const auto& t : f.tensors) j["weight_map"][t] = f.name;
  write_text(files::join(dir, kIndexFile), j.dump(2) + "\n");
}

// The weights: every table row loaded, transformed and written, one at a time.
std::vector<WrittenFile> write_weights(WeightSource& source, const std::string& dir, torch::ScalarType dtype,
                                       uint64_t max_shard_bytes, ExportResult& r) {
  const auto& c = source.spec().model;
  const auto maps = tensor_maps(c);
  std::vector<PlannedTensor> planned;
  for (const auto& m : maps)
    for (size_t k = 0; k < m.hf.size(); ++k) planned.push_back({m.hf[k], checkpoint::dtype_of(dtype), m.hf_shapes[k]});
  auto plan = plan_shards(planned, max_shard_bytes);
  const auto names = hf_shard_names(plan.size());
  ShardWriter writer(dir, plan, names, {{"format", "pt"}}, /*fsync=*/true);
  for (const auto& m : maps) {
    const auto ours = source.load(m.ours, dtype);
    check_shape(m, ours, source);
    const auto outs = to_hf(m, ours, c);
    for (size_t k = 0; k < outs.size(); ++k) writer.write(m.hf[k], outs[k]);
  }
  for (const auto& t : planned) r.weight_bytes += t.bytes();
  r.tensors = static_cast<int64_t>(planned.size());
  return writer.finish();
}

}  // namespace

ExportResult export_hf(WeightSource& source, const std::string& out, const ExportOptions& options) {
  std::string out_dir = out;
  while (out_dir.size() > 1 && out_dir.back() == '/') out_dir.pop_back();
  const auto& spec = source.spec();
  ExportResult r;
  r.dir = out_dir;
  r.family = family_name(family_of(spec.model));
  const auto& dtype = dtype_named(options.dtype, source.model_dtype());
  r.dtype = dtype.config;
  checkpoint::check_export_target(options.source, out_dir, options.overwrite);
  const std::string tmp = out_dir + ".tmp-" + checkpoint::random_nonce();
  files::make_directories(tmp);
  try {
    const auto written = write_weights(source, tmp, dtype.type, options.max_shard_bytes, r);
    for (const auto& f : written) r.files.push_back(f.name);
    if (written.size() > 1) {
      write_index(tmp, written, r.weight_bytes);
      r.files.push_back(kIndexFile);
    }
    const auto ids = write_tokenizer(spec, tmp, r);
    write_text(files::join(tmp, "config.json"), config_json(spec.model, dtype.config, ids.bos, ids.eos));
    nlohmann::json generation = {{"_from_model_config", true}};
    if (ids.bos >= 0) generation["bos_token_id"] = ids.bos;
    if (ids.eos >= 0) generation["eos_token_id"] = ids.eos;
    write_text(files::join(tmp, "generation_config.json"), generation.dump(2) + "\n");
    r.files.insert(r.files.end(), {"config.json", "generation_config.json"});
    checkpoint::fsync_directory(tmp);
    if (files::exists(out_dir)) files::remove_tree(out_dir);
    ME_CHECK(::rename(tmp.c_str(), out_dir.c_str()) == 0, "export: cannot rename '", tmp, "' to '", out_dir, "'");
    checkpoint::fsync_directory(files::parent(out_dir));
  } catch (...) {
    files::remove_tree(tmp);
    throw;
  }
  return r;
}

ExportResult export_hf(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& options) {
  auto o = options;
  o.source = checkpoint;
  checkpoint::check_export_target(o.source, out_dir, o.overwrite);  // before the checkpoint is read
  auto source = checkpoint_source(checkpoint);
  return export_hf(*source, out_dir, o);
}

}  // namespace me::hf
