// One record of a jsonl input (`megaengine preprocess`): a JSON object per line, its document
// text under a chosen key. Split out of preprocess.cpp so it can be fuzzed on its own.
#pragma once
#include <string>

namespace me::data {

struct JsonlRecord {
  bool ok = false;
  std::string text;  // the document, when ok
  std::string why;   // why the line is not a record, when not ok (for "file:line: why")
};

// Parses [begin, end): one line, without its newline. Never throws for bad input.
JsonlRecord parse_jsonl_record(const char* begin, const char* end, const std::string& key);

}  // namespace me::data
