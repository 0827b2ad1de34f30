#include "engine/data/jsonl_record.h"

#include <nlohmann/json.hpp>

#include "engine/core/error.h"

namespace me::data {

JsonlRecord parse_jsonl_record(const char* begin, const char* end, const std::string& key) {
  JsonlRecord r;
  try {
    auto j = nlohmann::json::parse(begin, end);
    if (!j.is_object()) {
      r.why = cat("a JSON ", j.type_name(), ", expected an object with a '", key, "' string");
    } else if (auto it = j.find(key); it == j.end()) {
      r.why = cat("the record has no key '", key, "' (choose the key with --json-key)");
    } else if (!it->is_string()) {
      r.why = cat("'", key, "' is a JSON ", it->type_name(), ", expected a string");
    } else {
      r.text = std::move(it->get_ref<std::string&>());
      r.ok = true;
    }
  } catch (const nlohmann::json::exception& ex) {
    // Not only parse errors: a number too large for a double (1e999) is an out_of_range error
    // (found by fuzzing: it escaped the worker thread and aborted preprocess).
    // nlohmann's message starts "[json.exception.parse_error.101] parse error at line 1, ...".
    std::string m = ex.what();
    if (auto k = m.find("] "); k != std::string::npos) m = m.substr(k + 2);
    r.why = (dynamic_cast<const nlohmann::json::parse_error*>(&ex) ? "malformed JSON: " : "unreadable JSON: ") + m;
  }
  return r;
}

}  // namespace me::data
