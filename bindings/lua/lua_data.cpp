// Data from Lua: tokenizers (encode/decode in the REPL), preprocessing, and the training
// loader on its own, so a recipe or a test can look at exactly the batches a run would see.
#include <torch/torch.h>

#include "bindings/lua/lua_model.h"
#include "bindings/lua/lua_recipe.h"
#include "bindings/lua/lua_tensor.h"
#include "bindings/lua/modules.h"
#include "engine/core/build_config.h"  // ME_HAVE_TOKENIZERS
#include "engine/data/gpt_loader.h"
#include "engine/train/train_data.h"
#if ME_HAVE_TOKENIZERS
#include "engine/data/preprocess.h"
#endif

namespace me::lua {
namespace {

const char* const kTokenizerMeta = "me.Tokenizer";
const char* const kLoaderMeta = "me.BatchLoader";

using TokenizerBox = std::unique_ptr<data::Tokenizer>;

data::Tokenizer& check_tokenizer(lua_State* L) {
  return *check_object<TokenizerBox>(L, 1, kTokenizerMeta, "tokenizer expected");
}

// core.tokenizer(spec) -> tokenizer
int tokenizer_new(lua_State* L) {
  check_table(L, 1);
  auto tok = train::load_tokenizer(read_tokenizer_spec(L, 1, "tokenizer"));
  push_object<TokenizerBox>(L, kTokenizerMeta, std::move(tok));
  return 1;
}

// tok:encode(text) -> { ids }
int tok_encode(lua_State* L) {
  const auto ids = check_tokenizer(L).encode(check_string(L, 2));
  lua_createtable(L, static_cast<int>(ids.size()), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    lua_pushinteger(L, ids[i]);
    lua_rawseti(L, -2, static_cast<lua_Integer>(i + 1));
  }
  return 1;
}

// tok:decode({ ids }) -> text
int tok_decode(lua_State* L) {
  auto& tok = check_tokenizer(L);
  check_table(L, 2);
  std::vector<int64_t> ids;
  const auto n = lua_rawlen(L, 2);
  for (lua_Unsigned i = 1; i <= n; ++i) {
    lua_rawgeti(L, 2, static_cast<lua_Integer>(i));
    if (!lua_isinteger(L, -1)) arg_error(L, 2, "a table of integer ids");
    ids.push_back(lua_tointeger(L, -1));
    lua_pop(L, 1);
  }
  const auto text = tok.decode(ids);
  lua_pushlstring(L, text.data(), text.size());
  return 1;
}

int tok_vocab_size(lua_State* L) {
  lua_pushinteger(L, check_tokenizer(L).vocab_size());
  return 1;
}
int tok_eod(lua_State* L) {
  lua_pushinteger(L, check_tokenizer(L).eod());
  return 1;
}
int tok_tostring(lua_State* L) {
  lua_pushstring(L, ("Tokenizer: " + check_tokenizer(L).describe()).c_str());
  return 1;
}

// core.preprocess{ input, output, format, json_key, tokenizer = spec, append_eod, workers,
// skip_bad_records } -> { documents, tokens, skipped, bytes, seconds }
int preprocess(lua_State* L) {
  check_table(L, 1);
#if ME_HAVE_TOKENIZERS
  data::PreprocessOptions o;
  o.input = field_string(L, 1, "input", "preprocess");
  o.output = field_string(L, 1, "output", "preprocess");
  o.format = field_string(L, 1, "format", "preprocess", o.format);
  o.json_key = field_string(L, 1, "json_key", "preprocess", o.json_key);
  o.append_eod = field_boolean(L, 1, "append_eod", "preprocess", o.append_eod);
  o.workers = static_cast<int>(field_integer(L, 1, "workers", "preprocess", o.workers));
  o.skip_bad_records = field_boolean(L, 1, "skip_bad_records", "preprocess", o.skip_bad_records);
  o.progress = field_boolean(L, 1, "progress", "preprocess", false);
  if (!push_field_table(L, 1, "tokenizer", "preprocess")) fail("preprocess: 'tokenizer' is required");
  auto tok = train::load_tokenizer(read_tokenizer_spec(L, lua_gettop(L), "preprocess.tokenizer"));
  lua_pop(L, 1);
  const auto s = data::preprocess(o, *tok);
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, s.documents);
  lua_setfield(L, -2, "documents");
  lua_pushinteger(L, s.tokens);
  lua_setfield(L, -2, "tokens");
  lua_pushinteger(L, s.skipped);
  lua_setfield(L, -2, "skipped");
  lua_pushinteger(L, s.bytes);
  lua_setfield(L, -2, "bytes");
  lua_pushnumber(L, s.seconds);
  lua_setfield(L, -2, "seconds");
  return 1;
#else
  fail("preprocess: this megaengine was built without its tokenizers (libpcre2-dev, nlohmann-json3-dev)");
#endif
}

struct LuaLoader {
  std::unique_ptr<data::BatchLoader> loader;
  std::string description;
};

LuaLoader& check_loader(lua_State* L) { return check_object<LuaLoader>(L, 1, kLoaderMeta, "loader expected"); }

// True when the spec at t gave data.blend (not data.prefix): even one entry is then a blend.
// core.loader(data_spec, { seq, micro, dp, dp_rank, accumulation, iters, consumed_samples, seed,
// builder, split }) -> loader. `builder`: this process builds the index caches (one rank; the
// others pass false after a barrier). `split`: "train" (default), "valid" or "test", built for
// iters x micro x dp x accumulation samples.
int loader_new(lua_State* L) {
  check_table(L, 1);
  check_table(L, 2);
  const auto d = read_data_spec(L, 1);
  ME_CHECK(d.kind == "gpt", "me.data.loader reads me.data.gpt{} data, got kind '", d.kind, "'");
  const auto c = train::gpt_data_config(d, field_integer(L, 2, "seq", "loader"),
                                  static_cast<uint64_t>(field_integer(L, 2, "seed", "loader", 1234)));
  const std::string split = field_string(L, 2, "split", "loader", std::string("train"));
  const size_t k = split == "train" ? 0 : split == "valid" ? 1 : split == "test" ? 2 : 3;
  ME_CHECK(k < 3, "loader.split: '", split, "' is not a split; use \"train\", \"valid\" or \"test\"");
  data::LoaderOptions o;
  o.micro = field_integer(L, 2, "micro", "loader");
  o.dp = field_integer(L, 2, "dp", "loader", 1);
  o.dp_rank = field_integer(L, 2, "dp_rank", "loader", 0);
  o.accumulation = field_integer(L, 2, "accumulation", "loader", 1);
  o.consumed_samples = field_integer(L, 2, "consumed_samples", "loader", 0);
  // As the trainer does: a run with eod_mask_loss sees those positions' labels ignored.
  train::set_eod_mask(d, d.eod_mask_loss ? train::load_tokenizer(d.tokenizer).get() : nullptr, o);
  const int64_t iters = field_integer(L, 2, "iters", "loader");
  const bool builder = field_boolean(L, 2, "builder", "loader", true);
  const size_t needed = static_cast<size_t>(iters * o.micro * o.dp * o.accumulation);
  std::array<size_t, 3> samples{0, 0, 0};
  samples[k] = needed;
  auto splits = data::build_gpt_splits(c, samples, builder);
  auto* l = push_object<LuaLoader>(L, kLoaderMeta);
  l->loader = std::make_unique<data::BatchLoader>(splits[k], o);
  l->description = cat("BatchLoader: ", splits[k]->size(), " ", split, " samples of ", c.seq_length + 1,
                       " tokens, micro ", o.micro, ", dp rank ", o.dp_rank, " of ", o.dp, ", accumulation ",
                       o.accumulation);
  return 1;
}

// loader:next() -> tokens, labels, first_sample
int loader_next(lua_State* L) {
  auto b = check_loader(L).loader->next();
  push_tensor(L, b.tokens);
  push_tensor(L, b.labels);
  lua_pushinteger(L, b.first_sample);
  return 3;
}
int loader_consumed(lua_State* L) {
  lua_pushinteger(L, check_loader(L).loader->consumed_samples());
  return 1;
}
int loader_tostring(lua_State* L) {
  lua_pushstring(L, check_loader(L).description.c_str());
  return 1;
}

}  // namespace

data::TokenizerSpec read_tokenizer_spec(lua_State* L, int t, const std::string& path) {
  data::TokenizerSpec s;
  s.kind = field_string(L, t, "kind", path);
  s.vocab_file = field_string(L, t, "vocab_file", path, std::string());
  s.merge_file = field_string(L, t, "merge_file", path, std::string());
  s.model_file = field_string(L, t, "model_file", path, std::string());
  return s;
}

void open_data(lua_State* L, int core) {
  static const luaL_Reg tok_methods[] = {{"encode", wrapped<tok_encode>}, {"decode", wrapped<tok_decode>},
                                         {"vocab_size", wrapped<tok_vocab_size>}, {"eod", wrapped<tok_eod>},
                                         {nullptr, nullptr}};
  static const luaL_Reg tok_meta[] = {{"__tostring", wrapped<tok_tostring>}, {nullptr, nullptr}};
  define_class<TokenizerBox>(L, kTokenizerMeta, tok_methods, tok_meta);
  static const luaL_Reg loader_methods[] = {{"next", wrapped<loader_next>},
                                            {"consumed_samples", wrapped<loader_consumed>}, {nullptr, nullptr}};
  static const luaL_Reg loader_meta[] = {{"__tostring", wrapped<loader_tostring>}, {nullptr, nullptr}};
  define_class<LuaLoader>(L, kLoaderMeta, loader_methods, loader_meta);
  static const luaL_Reg fns[] = {{"tokenizer", wrapped<tokenizer_new>}, {"preprocess", wrapped<preprocess>},
                                 {"loader", wrapped<loader_new>}, {nullptr, nullptr}};
  lua_newtable(L);
  luaL_setfuncs(L, fns, 0);
  lua_setfield(L, core, "data");
}

}  // namespace me::lua
