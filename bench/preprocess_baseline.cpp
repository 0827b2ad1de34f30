// The simplest correct preprocessing, for comparison with `megaengine preprocess`: one thread
// reads a jsonl line, parses it, tokenizes the text, appends eod and writes the document.
//   me_preprocess_baseline INPUT.jsonl OUTPUT_PREFIX ENCODER_JSON VOCAB_BPE
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/data/gpt2_tokenizer.h"
#include "engine/data/indexed_dataset.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s INPUT.jsonl OUTPUT_PREFIX ENCODER_JSON VOCAB_BPE\n", argv[0]);
    return 2;
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    me::data::GPT2Tokenizer tok(argv[3], argv[4]);
    me::data::IndexedDatasetWriter out(argv[2], me::data::dtype_for_vocab(tok.vocab_size()));
    std::ifstream in(argv[1], std::ios::binary);
    std::string line;
    long long bytes = 0, docs = 0;
    const auto t1 = std::chrono::steady_clock::now();
    while (std::getline(in, line)) {
      bytes += static_cast<long long>(line.size()) + 1;
      auto ids = tok.encode(nlohmann::json::parse(line).at("text").get<std::string>());
      ids.push_back(tok.eod());
      out.add_sequence(ids);
      out.end_document();
      ++docs;
    }
    out.finalize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const double load = std::chrono::duration<double>(t1 - t0).count();
    std::printf("baseline: %lld documents, %.1f MB in %.2f s (%.2f MB/s, 1 thread; tokenizer load %.2f s)\n", docs,
                static_cast<double>(bytes) / 1e6, s, static_cast<double>(bytes) / 1e6 / s, load);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baseline: %s\n", e.what());
    return 1;
  }
  return 0;
}
