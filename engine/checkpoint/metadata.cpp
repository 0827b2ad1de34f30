#include "engine/checkpoint/metadata.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/core/error.h"

namespace me::checkpoint {

using nlohmann::json;

namespace {

constexpr const char* kFormatName = "megaengine-checkpoint";

// visit_fields into a JSON object, and back (a field the JSON lacks keeps its value).
struct JsonWriter {
  json& j;
  template <class T>
  void operator()(const char* name, const T& v) {
    j[name] = v;
  }
};
struct JsonReader {
  const json& j;
  template <class T>
  void operator()(const char* name, T& v) {
    if (j.contains(name)) v = j.at(name).get<T>();
  }
};

json data_to_json(const config::DataSpec& d) {
  json j = {{"kind", d.kind}, {"path", d.path}, {"holdout", d.holdout}, {"split", d.split},
            {"cache_dir", d.cache_dir}, {"eod_mask_loss", d.eod_mask_loss}, {"source", d.source},
            {"source_format", d.source_format}, {"json_key", d.json_key}, {"blend_given", d.blend_given}};
  j["blend"] = json::array();
  for (const auto& [w, p] : d.blend) j["blend"].push_back({w, p});
  const auto& t = d.tokenizer;
  j["tokenizer"] = {{"kind", t.kind}, {"vocab_file", t.vocab_file}, {"merge_file", t.merge_file},
                    {"model_file", t.model_file}};
  return j;
}

config::DataSpec data_from_json(const json& j) {
  config::DataSpec d;
  auto get = [&](const char* k, auto& v) {
    if (j.contains(k)) v = j.at(k).get<std::decay_t<decltype(v)>>();
  };
  get("kind", d.kind);
  get("path", d.path);
  get("holdout", d.holdout);
  get("split", d.split);
  get("cache_dir", d.cache_dir);
  get("eod_mask_loss", d.eod_mask_loss);
  get("source", d.source);
  get("source_format", d.source_format);
  get("json_key", d.json_key);
  get("blend_given", d.blend_given);
  if (j.contains("blend"))
    for (const auto& b : j.at("blend")) d.blend.emplace_back(b.at(0).get<double>(), b.at(1).get<std::string>());
  if (j.contains("tokenizer")) {
    const auto& t = j.at("tokenizer");
    d.tokenizer.kind = t.value("kind", "");
    d.tokenizer.vocab_file = t.value("vocab_file", "");
    d.tokenizer.merge_file = t.value("merge_file", "");
    d.tokenizer.model_file = t.value("model_file", "");
  }
  return d;
}

json piece_to_json(const Piece& p) {
  return {{"file", p.file}, {"key", p.key}, {"dim", p.dim}, {"start", p.start}, {"length", p.length},
          {"flat_start", p.flat_start}, {"flat_length", p.flat_length}};
}

Piece piece_from_json(const json& j) {
  Piece p;
  p.file = j.at("file").get<std::string>();
  p.key = j.at("key").get<std::string>();
  p.dim = j.at("dim").get<int64_t>();
  p.start = j.at("start").get<int64_t>();
  p.length = j.at("length").get<int64_t>();
  p.flat_start = j.at("flat_start").get<int64_t>();
  p.flat_length = j.at("flat_length").get<int64_t>();
  return p;
}

}  // namespace

std::string recipe_to_json(const config::Recipe& spec) {
  json j;
  config::visit_top_fields(spec, JsonWriter{j});
  JsonWriter model{j["model"]};
  model::visit_fields(spec.model, model);
  j["data"] = data_to_json(spec.data);
  config::visit_sections(spec, [&](const char* name, const auto& section) { visit_fields(section, JsonWriter{j[name]}); });
  return j.dump(1);
}

config::Recipe recipe_from_json(const std::string& text, const std::string& file) {
  try {
    const json j = json::parse(text);
    config::Recipe spec;
    config::visit_top_fields(spec, JsonReader{j});
    if (j.contains("model")) model::visit_fields(spec.model, JsonReader{j.at("model")});
    if (j.contains("data")) spec.data = data_from_json(j.at("data"));
    config::visit_sections(spec, [&](const char* name, auto& section) {
      if (j.contains(name)) visit_fields(section, JsonReader{j.at(name)});
    });
    return spec;
  } catch (const json::exception& e) {
    fail("'", file, "': its recipe cannot be read (", e.what(), ")");
  }
}

std::string Metadata::to_json() const {
  json j;
  j["format"] = kFormatName;
  j["version"] = version;
  j["iteration"] = iteration;
  j["consumed_samples"] = consumed_samples;
  j["skipped_iterations"] = skipped;
  j["nan_iterations"] = nan;
  j["optimizer_steps"] = optimizer_steps;
  j["loss_scale"] = {{"scale", loss_scale}, {"good_steps", loss_scale_good_steps},
                     {"hysteresis_left", loss_scale_hysteresis_left}};
  j["vocab"] = vocab;
  j["layout"] = {{"world", layout.world}, {"tp", layout.tp}, {"pp", layout.pp}, {"dp", layout.dp},
                 {"stage_layers", layout.stage_layers}, {"distributed_optimizer", layout.distributed_optimizer},
                 {"precision", layout.precision}};
  j["recipe"] = recipe_json.empty() ? json::object() : json::parse(recipe_json);
  j["tensors"] = json::object();
  j["shards"] = json::object();
  for (const auto& [name, t] : tensors) {
    json pieces = json::array();
    for (const auto& p : t.pieces) pieces.push_back(piece_to_json(p));
    j["tensors"][name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"pieces", pieces}};
  }
  for (const auto& [file, s] : shards) {
    char crc[9];
    std::snprintf(crc, sizeof crc, "%08x", s.crc32c);
    j["shards"][file] = {{"rank", s.rank}, {"bytes", s.bytes}, {"crc32c", crc}};
  }
  return j.dump(1);
}

namespace {

// Which field of a metadata.json is missing or of the wrong type, for the message (nlohmann's
// own says only "type must be number, but is string"). Kinds: 'i' integer, 'u' unsigned,
// 'n' number, 's' string, 'b' boolean, 'o' object, 'a' array of integers.
struct FieldCheck {
  std::string bad;  // "field 'layout.tp' is a string, expected an integer"; empty: none found
  void need(const json& parent, const std::string& path, const char* key, char kind, bool optional = false) {
    if (!bad.empty()) return;
    if (!parent.is_object() || !parent.contains(key)) {
      if (!optional) bad = cat("field '", path, key, "' is missing");
      return;
    }
    const json& v = parent.at(key);
    const bool ok = kind == 'i'   ? v.is_number_integer()
                    : kind == 'u' ? v.is_number_unsigned()
                    : kind == 'n' ? v.is_number()
                    : kind == 's' ? v.is_string()
                    : kind == 'b' ? v.is_boolean()
                    : kind == 'o' ? v.is_object()
                                  : v.is_array() && std::all_of(v.begin(), v.end(), [](const json& x) {
                                      return x.is_number_integer();
                                    });
    static const std::map<char, const char*> names = {{'i', "an integer"}, {'u', "a non-negative integer"},
                                                      {'n', "a number"},   {'s', "a string"},
                                                      {'b', "true or false"}, {'o', "an object"},
                                                      {'a', "an array of integers"}};
    if (!ok) bad = cat("field '", path, key, "' has type ", v.type_name(), ", expected ", names.at(kind));
  }
};

std::string bad_field(const json& j) {
  FieldCheck c;
  for (const char* k : {"version", "iteration", "consumed_samples"}) c.need(j, "", k, 'i');
  for (const char* k : {"skipped_iterations", "nan_iterations", "optimizer_steps", "vocab"}) c.need(j, "", k, 'i', true);
  c.need(j, "", "layout", 'o');
  c.need(j, "", "tensors", 'o');
  c.need(j, "", "shards", 'o');
  if (!c.bad.empty()) return c.bad;
  for (const char* k : {"world", "tp", "pp", "dp"}) c.need(j["layout"], "layout.", k, 'i');
  c.need(j["layout"], "layout.", "stage_layers", 'a');
  c.need(j["layout"], "layout.", "distributed_optimizer", 'b');
  c.need(j["layout"], "layout.", "precision", 's', true);
  for (const auto& [name, t] : j["tensors"].items()) {
    const std::string at = "tensors." + name + ".";
    c.need(t, at, "dtype", 's');
    c.need(t, at, "shape", 'a');
    if (c.bad.empty() && !(t.contains("pieces") && t["pieces"].is_array())) c.bad = cat("field '", at, "pieces' is not an array");
    for (size_t i = 0; c.bad.empty() && i < t["pieces"].size(); ++i) {
      const std::string piece = cat(at, "pieces[", i, "].");
      for (const char* k : {"file", "key"}) c.need(t["pieces"][i], piece, k, 's');
      for (const char* k : {"dim", "start", "length", "flat_start", "flat_length"}) c.need(t["pieces"][i], piece, k, 'i');
    }
  }
  for (const auto& [name, s] : j["shards"].items()) {
    c.need(s, "shards." + name + ".", "rank", 'i');
    c.need(s, "shards." + name + ".", "bytes", 'u');
    c.need(s, "shards." + name + ".", "crc32c", 's');
  }
  return c.bad.empty() ? "a field of the checkpoint's metadata is missing or has the wrong type" : c.bad;
}

}  // namespace

Metadata Metadata::parse(const std::string& text, const std::string& file) {
  Metadata m;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("'", file, "' is not a checkpoint's metadata: it is not JSON (", e.what(), ")");
  }
  ME_CHECK(j.is_object() && j.value("format", "") == kFormatName, "'", file, "' is not a megaengine checkpoint's ",
           "metadata (no \"format\": \"", kFormatName, "\")");
  try {
    m.version = j.at("version").get<int64_t>();
    ME_CHECK(m.version <= kFormatVersion, "'", file, "' is checkpoint format version ", m.version,
             ", newer than this megaengine reads (", kFormatVersion, "): use a newer megaengine");
    m.iteration = j.at("iteration").get<int64_t>();
    m.consumed_samples = j.at("consumed_samples").get<int64_t>();
    m.skipped = j.value("skipped_iterations", int64_t{0});
    m.nan = j.value("nan_iterations", int64_t{0});
    m.optimizer_steps = j.value("optimizer_steps", int64_t{0});
    if (j.contains("loss_scale")) {
      const auto& s = j.at("loss_scale");
      m.loss_scale = s.value("scale", 0.0);
      m.loss_scale_good_steps = s.value("good_steps", int64_t{0});
      m.loss_scale_hysteresis_left = s.value("hysteresis_left", int64_t{0});
    }
    m.vocab = j.value("vocab", int64_t{0});
    const auto& l = j.at("layout");
    m.layout.world = l.at("world").get<int64_t>();
    m.layout.tp = l.at("tp").get<int64_t>();
    m.layout.pp = l.at("pp").get<int64_t>();
    m.layout.dp = l.at("dp").get<int64_t>();
    m.layout.stage_layers = l.at("stage_layers").get<std::vector<int64_t>>();
    m.layout.distributed_optimizer = l.at("distributed_optimizer").get<bool>();
    m.layout.precision = l.value("precision", "");
    m.recipe_json = j.at("recipe").dump();
    for (const auto& [name, t] : j.at("tensors").items()) {
      TensorRecord r;
      r.dtype = t.at("dtype").get<std::string>();
      r.shape = t.at("shape").get<std::vector<int64_t>>();
      for (const auto& p : t.at("pieces")) r.pieces.push_back(piece_from_json(p));
      m.tensors[name] = std::move(r);
    }
    for (const auto& [f, s] : j.at("shards").items()) {
      // Shards live in the iteration directory: a path elsewhere is not a checkpoint's shard.
      ME_CHECK(is_plain_file_name(f), "'", file, "': shard '", f, "' is not a file name in the checkpoint's directory ",
               "(a path such as '../x' or '/x' is refused): the metadata is damaged or was not written by megaengine");
      ShardRecord r;
      r.rank = s.at("rank").get<int>();
      r.bytes = s.at("bytes").get<uint64_t>();
      r.crc32c = static_cast<uint32_t>(std::stoul(s.at("crc32c").get<std::string>(), nullptr, 16));
      m.shards[f] = r;
    }
  } catch (const json::exception& e) {
    fail("'", file, "': ", bad_field(j), " (", e.what(), ")");
  } catch (const std::invalid_argument&) {
    fail("'", file, "': a shard checksum is not hexadecimal");
  }
  for (const auto& [name, t] : m.tensors)
    for (const auto& p : t.pieces)
      ME_CHECK(m.shards.count(p.file), "'", file, "': tensor '", name, "' is in shard '", p.file,
               "', which the metadata does not list");
  return m;
}

void Metadata::merge_tensors(const Metadata& other) {
  for (const auto& [name, t] : other.tensors) {
    auto [it, added] = tensors.emplace(name, t);
    if (added) continue;
    ME_CHECK(it->second.dtype == t.dtype && it->second.shape == t.shape, "checkpoint: ranks disagree on tensor '", name,
             "' (", it->second.dtype, " vs ", t.dtype, ")");
    it->second.pieces.insert(it->second.pieces.end(), t.pieces.begin(), t.pieces.end());
  }
}

}  // namespace me::checkpoint
