// Hugging Face files: a checkpoint exported into shards with an index (headers read back by an
// independent parse of the bytes: names, dtypes, shapes, offsets, the data itself), imported
// back exactly; damaged or mismatched model directories refused naming the file and tensor.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "engine/hf/convert.h"
#include "engine/checkpoint/saver.h"
#include "engine/core/files.h"
#include "engine/model/transformer.h"
#include "temp_dir.h"
#include "test_assets.h"  // slurp, spit

using namespace me;
using namespace me::checkpoint;
using nlohmann::json;

namespace {

model::TransformerConfig tiny(const std::string& kind) {
  auto c = kind == "llama" ? model::TransformerConfig::llama() : model::TransformerConfig::gpt();
  c.vocab = 100;
  c.vocab_divisible_by = 64;
  c.seq = 16;
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  if (kind == "llama") {
    c.query_groups = 2;
    c.ffn_hidden = 48;
  }
  return c;
}

// A checkpoint of `m`'s weights as one process saves it; returns its global tensors.
std::map<std::string, torch::Tensor> save_checkpoint(model::Transformer& m, const std::string& dir) {
  std::vector<StateTensor> tensors;
  std::map<std::string, torch::Tensor> global;
  torch::manual_seed(11);
  for (const auto& p : m->named_parameters()) {
    torch::NoGradGuard no_grad;
    p.value().copy_(torch::randn(p.value().sizes()) * 0.1);
    StateTensor t;
    t.name = "model." + m->global_name(p.key());
    t.tensor = p.value();
    t.global_shape = p.value().sizes().vec();
    t.flat_length = p.value().numel();
    tensors.push_back(t);
    global[t.name] = p.value().detach().clone();
  }
  config::Recipe spec;
  spec.name = "hf-test";
  spec.model = m->config();
  Metadata meta;
  meta.vocab = spec.model.vocab;
  meta.recipe_json = recipe_to_json(spec);
  meta.layout.stage_layers = {spec.model.layers};
  SaverOptions o;
  o.dir = dir;
  o.async = false;
  CheckpointSaver saver(o, nullptr);
  saver.save(tensors, meta);
  saver.finish();
  return global;
}

// An independent reading of a safetensors file: {name: (dtype, shape, bytes)}, checking that the
// offsets tile the data section from 0 to the end of the file.
std::map<std::string, std::tuple<std::string, std::vector<int64_t>, std::string>> parse_file(const std::string& path) {
  const auto bytes = slurp(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[static_cast<size_t>(i)])) << (8 * i);
  const auto header = json::parse(bytes.substr(8, n));
  CHECK(header.at("__metadata__").at("format") == "pt");  // transformers refuses files without it
  const std::string data = bytes.substr(8 + n);
  std::map<std::string, std::tuple<std::string, std::vector<int64_t>, std::string>> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    const auto begin = v.at("data_offsets").at(0).get<uint64_t>(), end = v.at("data_offsets").at(1).get<uint64_t>();
    ranges.emplace_back(begin, end);
    out[name] = {v.at("dtype").get<std::string>(), v.at("shape").get<std::vector<int64_t>>(), data.substr(begin, end - begin)};
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& [b, e] : ranges) {
    CHECK(b == at);
    at = e;
  }
  CHECK(at == data.size());
  return out;
}

}  // namespace

TEST_CASE("export to shards with an index, read back independently, imported back exactly", "[hf]") {
  for (const std::string kind : {"llama", "gpt"}) {
    SECTION(kind) {
      TempDir dir;
      const auto c = tiny(kind);
      model::Transformer m(c);
      const auto saved = save_checkpoint(m, dir / "ckpt");
      hf::ExportOptions o;
      o.max_shard_bytes = 40000;  // several shards for a 60k-parameter model
      const auto r = hf::export_hf(dir / "ckpt", dir / "hf", o);
      CHECK(r.dtype == "float32");
      const auto index = json::parse(slurp(dir / "hf/model.safetensors.index.json"));
      std::map<std::string, std::string> where = index.at("weight_map").get<std::map<std::string, std::string>>();
      std::set<std::string> shard_files;
      for (const auto& [t, f] : where) shard_files.insert(f);
      CHECK(shard_files.size() > 1);
      uint64_t total = 0;
      std::map<std::string, torch::Tensor> hf_tensors;
      for (const auto& f : shard_files)
        for (auto& [name, entry] : parse_file(dir / "hf/" + f)) {
          CHECK(where.at(name) == f);
          const auto& [dtype, shape, bytes] = entry;
          CHECK(dtype == "F32");
          total += bytes.size();
          hf_tensors[name] = torch::from_blob(const_cast<char*>(bytes.data()), shape, torch::kFloat).clone();
        }
      CHECK(index.at("metadata").at("total_size") == total);
      CHECK(hf_tensors.size() == where.size());
      // Each Hugging Face tensor holds exactly what the table's transform makes of ours.
      for (const auto& map : hf::tensor_maps(c)) {
        const auto want = hf::to_hf(map, saved.at("model." + map.ours), c);
        for (size_t k = 0; k < want.size(); ++k) CHECK(torch::equal(hf_tensors.at(map.hf[k]), want[k]));
      }
      const auto config = hf::config_from_json(slurp(dir / "hf/config.json"), "config.json");
      CHECK_NOTHROW(hf::check_matches(config, c, "config.json"));
      const auto imported = hf::import_hf(dir / "hf", c, dir / "back");
      CheckpointReader reader(imported);
      CHECK(reader.metadata().iteration == 0);
      for (const auto& [name, t] : saved) {
        const bool vocab = name == "model.embedding.weight" || name == "model.output.weight";
        StateTensor s;
        s.name = name;
        s.global_shape = t.sizes().vec();
        s.tensor = torch::zeros_like(t);
        s.flat_length = t.numel();
        s.padded_vocab = vocab;
        reader.load(s);
        const auto rows = vocab ? c.vocab : t.size(0);  // the padding rows are not exported
        CHECK(torch::equal(s.tensor.narrow(0, 0, rows), t.narrow(0, 0, rows)));
      }
    }
  }
}

TEST_CASE("bad Hugging Face directories are refused naming the file and tensor", "[hf]") {
  TempDir dir;
  const auto c = tiny("llama");
  model::Transformer m(c);
  save_checkpoint(m, dir / "ckpt");
  hf::export_hf(dir / "ckpt", dir / "hf");
  const auto file = dir / "hf/model.safetensors";
  const auto original = slurp(file);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(original[static_cast<size_t>(i)])) << (8 * i);
  const auto header = json::parse(original.substr(8, n));
  const std::string data = original.substr(8 + n);
  auto rewrite = [&](const json& h) {  // the same data under another header
    std::string text = h.dump();
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
    spit(file, out + text + data);
  };
  auto import_fails = [&](const std::string& what, const model::TransformerConfig& recipe) {
    files::remove_tree(dir / "out");
    CHECK_THROWS_WITH(hf::import_hf(dir / "hf", recipe, dir / "out"), Catch::Contains(what));
    CHECK(files::list(dir / "out").empty());  // nothing committed
  };
  const std::string up = "model.layers.1.mlp.up_proj.weight";
  SECTION("a missing tensor") {
    auto h = header;
    h.erase(up);
    rewrite(h);
    import_fails("has no tensor '" + up + "' (megaengine's blocks.1.mlp.gate_up.weight)", c);
  }
  SECTION("offsets past the end of the file") {
    auto h = header;
    h[up]["data_offsets"][1] = data.size() + 4;
    rewrite(h);
    import_fails(file + "': tensor '" + up + "': its bytes [", c);
  }
  SECTION("a dtype we cannot read") {
    auto h = header;
    h[up]["dtype"] = "F8_E4M3";
    rewrite(h);
    import_fails(file + "': tensor '" + up + "': dtype 'F8_E4M3' cannot be read", c);
  }
  SECTION("integer weights") {
    auto h = header;
    auto& e = h[up];
    e["dtype"] = "I32";  // the same bytes, 4 to an element
    rewrite(h);
    import_fails(file + "': tensor '" + up + "' is I32; only F32, BF16, F16 and F64 weights can be imported", c);
  }
  SECTION("a shape the config does not make") {
    auto h = header;
    h[up]["shape"] = {24, 64};  // the same number of elements
    rewrite(h);
    import_fails(file + "': tensor '" + up + "' is [24, 64], config.json makes it [48, 32]", c);
  }
  SECTION("a config that does not match the recipe") {
    auto other = c;
    other.layers = 3;
    other.norm_eps = 1e-6;
    import_fails("model.layers: 3 in the recipe, 2 in config.json (num_hidden_layers)", other);
    import_fails("model.norm_eps: 1e-06 in the recipe, 1e-05 in config.json (rms_norm_eps)", other);
  }
  SECTION("an export over a non-empty directory") {
    CHECK_THROWS_WITH(hf::export_hf(dir / "ckpt", dir / "hf"), Catch::Contains("exists and is not empty"));
  }
}

// Issue 38, item 12: a config.json whose n_layer is far beyond the weight files (10^7) ended in
// std::bad_alloc, after allocating in proportion to it; it is now checked against the names in
// the safetensors headers first.
TEST_CASE("a config.json with more layers than its weights is refused before allocating", "[hf]") {
  TempDir dir;
  const auto c = tiny("gpt");
  model::Transformer m(c);
  save_checkpoint(m, dir / "ckpt");
  hf::export_hf(dir / "ckpt", dir / "hf");
  auto config = json::parse(slurp(dir / "hf/config.json"));
  for (int64_t layers : {int64_t{10000000}, int64_t{3}}) {
    config["n_layer"] = layers;
    spit(dir / "hf/config.json", config.dump());
    CHECK_THROWS_WITH(hf::import_hf(dir / "hf", dir / "out"),
                      Catch::Contains("config.json': n_layer is " + std::to_string(layers) +
                                      ", but the weight files of '" + dir / "hf" + "' hold 2 layers (0 .. 1)"));
    CHECK(files::list(dir / "out").empty());
  }
}
