// `megaengine preprocess`: documents (jsonl records, or paragraphs of a text file) -> tokens ->
// a Megatron .bin/.idx. A reader thread cuts the input into chunks of whole records, N worker
// threads parse and tokenize chunks, and the calling thread writes the results in input order,
// so the output is identical for any number of workers. No LibTorch.
#pragma once
#include <cstdint>
#include <string>

#include "engine/data/tokenizer.h"

namespace me::data {

struct PreprocessOptions {
  std::string input;
  std::string format = "jsonl";  // jsonl: one JSON object per line | text: paragraphs (blank-line separated)
  std::string json_key = "text";
  std::string output;            // exact output prefix: writes <output>.bin and <output>.idx
  bool append_eod = false;       // the tokenizer's eod id after every non-empty document
  int workers = 1;
  bool skip_bad_records = false;  // false: the first malformed record fails the run, nothing is written
  bool progress = true;           // a progress line on stderr with MB/s
  size_t chunk_bytes = 1 << 20;   // input handed to a worker at once (whole records)
};

struct PreprocessStats {
  int64_t documents = 0, skipped = 0, tokens = 0;
  int64_t bytes = 0;  // input bytes read
  double seconds = 0;
  double mb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / 1e6 / seconds : 0; }
};

// Megatron's output name for a json key: <prefix>_<key>_document.
std::string megatron_output_prefix(const std::string& output_prefix, const std::string& json_key);

// Throws me::Error naming the file (and the line, for a malformed record) on any failure; the
// output is then left as it was (the writer only renames finished files into place).
PreprocessStats preprocess(const PreprocessOptions& options, const Tokenizer& tokenizer);

// The command line: `megaengine preprocess --input F --output-prefix P --tokenizer gpt2 ...`.
// Returns the process exit status (0 ok, 1 failed, 2 bad usage); prints its own messages.
// `asset_dir`: where default tokenizer files are looked for.
int preprocess_main(int argc, char** argv, const std::string& asset_dir);

}  // namespace me::data
