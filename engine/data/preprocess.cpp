#include "engine/data/preprocess.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/format.h"
#include "engine/data/indexed_dataset.h"
#include "engine/data/jsonl_record.h"

namespace me::data {
namespace {

// Whole records of the input, as read.
struct Chunk {
  size_t index = 0;
  int64_t first_line = 1;
  std::string text;
};

// One chunk tokenized: its documents back to back, and the records that could not be read.
struct ChunkResult {
  std::vector<int64_t> tokens;
  std::vector<size_t> lengths;  // tokens per document
  std::vector<std::pair<int64_t, std::string>> bad;  // line, why
  int64_t bytes = 0;
};

bool is_blank(const char* b, const char* e) {
  for (; b != e; ++b)
    if (*b != ' ' && *b != '\t' && *b != '\r') return false;
  return true;
}

void add_document(const std::string& text, const PreprocessOptions& o, const Tokenizer& tok, ChunkResult& r) {
  const size_t before = r.tokens.size();
  tok.encode_into(text, r.tokens);
  if (o.append_eod && r.tokens.size() > before) r.tokens.push_back(tok.eod());
  r.lengths.push_back(r.tokens.size() - before);
}

// One JSON object per line; blank lines are not records.
void tokenize_jsonl(const Chunk& c, const PreprocessOptions& o, const Tokenizer& tok, ChunkResult& r) {
  const char* p = c.text.data();
  const char* end = p + c.text.size();
  for (int64_t line = c.first_line; p < end; ++line) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
    const char* e = nl ? nl : end;
    if (!is_blank(p, e)) {
      JsonlRecord record = parse_jsonl_record(p, e, o.json_key);
      if (record.ok)
        add_document(record.text, o, tok, r);
      else
        r.bad.emplace_back(line, std::move(record.why));
    }
    p = e + 1;
  }
}

// Paragraphs: runs of non-blank lines, each one document (its inner newlines kept).
void tokenize_text(const Chunk& c, const PreprocessOptions& o, const Tokenizer& tok, ChunkResult& r) {
  const char* p = c.text.data();
  const char* end = p + c.text.size();
  const char* start = nullptr;  // of the paragraph being collected
  const char* last = nullptr;   // end of its last line
  for (; p <= end;) {
    const char* nl = p < end ? static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p))) : nullptr;
    const char* e = nl ? nl : end;
    const bool blank = is_blank(p, e);
    if (!blank) {
      if (!start) start = p;
      last = e;
    }
    if ((blank || !nl) && start) {
      add_document(std::string(start, last), o, tok, r);
      start = nullptr;
    }
    if (!nl) break;
    p = nl + 1;
  }
}

// Where the last complete record of `buf` ends (one past its separator), or npos.
size_t last_boundary(const std::string& buf, bool text) {
  if (!text) {
    const size_t k = buf.rfind('\n');
    return k == std::string::npos ? k : k + 1;
  }
  const size_t k = buf.rfind("\n\n");
  return k == std::string::npos ? k : k + 2;
}

class ProgressLine {
 public:
  ProgressLine(bool on, int64_t total)
      : on_(on), tty_(isatty(2) == 1), total_(total), printed_(std::chrono::steady_clock::now()) {}
  void update(const PreprocessStats& s, bool last) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    // A terminal gets a live line; a log file (sbatch) a line every few seconds.
    const double every = tty_ ? 0.25 : 5.0;
    if (!last && std::chrono::duration<double>(now - printed_).count() < every) return;
    printed_ = now;
    const double pct = total_ > 0 ? 100.0 * static_cast<double>(s.bytes) / static_cast<double>(total_) : 100.0;
    const int width = 30, filled = static_cast<int>(pct / 100.0 * width);
    std::fprintf(stderr, "%spreprocess [%.*s%*s] %5.1f%% %8.1f MB / %.1f MB  %6.1f MB/s  %lld documents  %lld tokens%s",
                 tty_ ? "\r" : "", filled, "##############################", width - filled, "", pct,
                 static_cast<double>(s.bytes) / 1e6, static_cast<double>(total_) / 1e6, s.mb_per_s(),
                 static_cast<long long>(s.documents), static_cast<long long>(s.tokens), tty_ && !last ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  bool on_, tty_;
  int64_t total_;
  std::chrono::steady_clock::time_point printed_;
};

}  // namespace

std::string megatron_output_prefix(const std::string& output_prefix, const std::string& json_key) {
  return output_prefix + "_" + json_key + "_document";
}

namespace {

// The input cut into chunks of whole records by a reader thread, tokenized by o.workers worker
// threads, and handed back in input order (so the output does not depend on the workers).
// At most 4 chunks per worker are in flight, which bounds memory.
class ChunkPipeline {
 public:
  ChunkPipeline(std::FILE* in, const PreprocessOptions& o, const Tokenizer& tok)
      : in_(in), o_(o), tok_(tok), text_(o.format == "text"), in_flight_(4 * static_cast<size_t>(o.workers)) {
    threads_.emplace_back([this] { read_chunks(); });
    for (int i = 0; i < o.workers; ++i) threads_.emplace_back([this] { tokenize_chunks(); });
  }
  // Stops and joins the threads however the caller leaves (an error stops them first).
  ~ChunkPipeline() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // The next chunk's result, in input order; false once everything read has been handed back.
  // Throws me::Error when the input cannot be read.
  bool next(ChunkResult& r) {
    std::unique_lock<std::mutex> g(m_);
    cv_.wait(g, [&] { return done_.count(written_) || !reader_error_.empty() || (eof_ && written_ == read_); });
    if (!reader_error_.empty()) fail(reader_error_);
    if (!done_.count(written_)) return false;
    r = std::move(done_[written_]);
    done_.erase(written_);
    ++written_;
    cv_.notify_all();
    return true;
  }

 private:
  void read_chunks() {
    std::string carry;
    int64_t line = 1;
    std::vector<char> buf(o_.chunk_bytes);
    for (;;) {
      const size_t n = std::fread(buf.data(), 1, buf.size(), in_);
      if (n == 0 && std::ferror(in_)) {
        std::lock_guard<std::mutex> g(m_);
        reader_error_ = cat("cannot read '", o_.input, "': ", std::strerror(errno));
        break;
      }
      carry.append(buf.data(), n);
      const bool at_end = n == 0;
      size_t cut = at_end ? carry.size() : last_boundary(carry, text_);
      if (cut == std::string::npos || cut == 0 || (at_end && carry.empty())) {
        if (at_end) break;
        continue;  // a record longer than a chunk: read on
      }
      Chunk c;
      c.first_line = line;
      c.text = carry.substr(0, cut);
      carry.erase(0, cut);
      for (char ch : c.text) line += ch == '\n';
      std::unique_lock<std::mutex> g(m_);
      cv_.wait(g, [&] { return stop_ || read_ - written_ < in_flight_; });
      if (stop_) return;
      c.index = read_++;
      todo_.push_back(std::move(c));
      cv_.notify_all();
    }
    std::lock_guard<std::mutex> g(m_);
    eof_ = true;
    cv_.notify_all();
  }

  void tokenize_chunks() {
    for (;;) {
      Chunk c;
      {
        std::unique_lock<std::mutex> g(m_);
        cv_.wait(g, [&] { return stop_ || !todo_.empty() || eof_; });
        if (stop_ || todo_.empty()) return;
        c = std::move(todo_.front());
        todo_.pop_front();
      }
      ChunkResult r;
      r.bytes = static_cast<int64_t>(c.text.size());
      try {
        (text_ ? tokenize_text : tokenize_jsonl)(c, o_, tok_, r);
      } catch (const std::exception& e) {  // a tokenizer failure: reported as the chunk's first line
        r.bad.emplace_back(c.first_line, e.what());
      }
      std::lock_guard<std::mutex> g(m_);
      done_.emplace(c.index, std::move(r));
      cv_.notify_all();
    }
  }

  std::FILE* in_;
  const PreprocessOptions& o_;
  const Tokenizer& tok_;
  const bool text_;
  const size_t in_flight_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Chunk> todo_;
  std::map<size_t, ChunkResult> done_;
  size_t read_ = 0, written_ = 0;  // chunks handed out / chunks handed back
  bool eof_ = false, stop_ = false;
  std::string reader_error_;
  std::vector<std::thread> threads_;
};

// The records of a chunk that could not be read: an error (nothing written), or with
// --skip-bad-records a warning for each of the first ten and a count.
void report_bad_records(const ChunkResult& r, const PreprocessOptions& o, PreprocessStats& s, int& warned) {
  for (const auto& [line, why] : r.bad) {
    if (!o.skip_bad_records)
      fail(o.input, ":", line, ": ", why, "; fix or remove the record, or pass --skip-bad-records to skip it (",
           o.output, ".bin/.idx not written)");
    if (warned++ < 10)
      std::fprintf(stderr, "preprocess: skipping %s:%lld: %s\n", o.input.c_str(), static_cast<long long>(line),
                   why.c_str());
    ++s.skipped;
  }
}

}  // namespace

PreprocessStats preprocess(const PreprocessOptions& o, const Tokenizer& tok) {
  ME_CHECK(o.format == "jsonl" || o.format == "text", "input format '", o.format, "' is unknown: use jsonl or text");
  ME_CHECK(o.workers >= 1 && o.workers <= 1024, "--workers must be between 1 and 1024, got ", o.workers);
  ME_CHECK(!o.output.empty(), "no output prefix given (--output-prefix)");
  std::FILE* in = std::fopen(o.input.c_str(), "rb");
  if (!in) fail("cannot open input '", o.input, "': ", std::strerror(errno));
  // Closed after the pipeline's threads are joined (declared before it).
  struct FileCloser {
    std::FILE* f;
    ~FileCloser() { std::fclose(f); }
  } closer{in};
  std::fseek(in, 0, SEEK_END);
  const int64_t total = std::ftell(in);
  std::fseek(in, 0, SEEK_SET);
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };

  ChunkPipeline chunks(in, o, tok);
  IndexedDatasetWriter writer(o.output, dtype_for_vocab(tok.vocab_size()));
  PreprocessStats s;
  ProgressLine progress(o.progress, total);
  int warned = 0;
  ChunkResult r;
  while (chunks.next(r)) {
    report_bad_records(r, o, s, warned);
    size_t at = 0;
    for (size_t n : r.lengths) {
      if (n > 0) writer.add_sequence(r.tokens.data() + at, n);
      writer.end_document();
      at += n;
    }
    s.documents += static_cast<int64_t>(r.lengths.size());
    s.tokens += static_cast<int64_t>(r.tokens.size());
    s.bytes += r.bytes;
    s.seconds = elapsed();
    progress.update(s, false);
  }
  writer.finalize();
  s.seconds = elapsed();
  progress.update(s, true);
  return s;
}

}  // namespace me::data

namespace me::data {
namespace {

const char* kPreprocessUsage =
    "usage: megaengine preprocess --input FILE --output-prefix PREFIX --tokenizer gpt2|sentencepiece [options]\n"
    "\n"
    "  --input FILE            jsonl (one JSON object per line), or text with --input-format text\n"
    "  --output-prefix PREFIX  writes PREFIX_<key>_document.bin/.idx (Megatron's names)\n"
    "  --tokenizer KIND        gpt2 | sentencepiece (also Megatron's GPT2BPETokenizer,\n"
    "                          SentencePieceTokenizer, Llama2Tokenizer)\n"
    "  --vocab-file F          gpt2: encoder.json / vocab.json (default: the fetched asset)\n"
    "  --merge-file F          gpt2: vocab.bpe / merges.txt (default: the fetched asset)\n"
    "  --tokenizer-model F     sentencepiece: tokenizer.model\n"
    "  --json-key KEY          the record's text field (default text)\n"
    "  --input-format FMT      jsonl (default) | text (a document per blank-line separated paragraph)\n"
    "  --append-eod            the end-of-document id after every document\n"
    "  --workers N             tokenizing threads (default 1)\n"
    "  --skip-bad-records      skip malformed records with a warning (default: fail naming the line)\n"
    "  --no-progress           no progress line on stderr\n"
    "\n"
    "exit status: 0 done, 1 failed (nothing written), 2 bad usage\n";

}  // namespace

int preprocess_main(int argc, char** argv, const std::string& asset_dir) {
  PreprocessOptions o;
  TokenizerSpec t;
  std::string prefix;
  auto usage_error = [](const std::string& m) {
    std::fprintf(stderr, "megaengine preprocess: %s\n(see megaengine preprocess --help)\n", m.c_str());
    return 2;
  };
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string& into) {
      if (i + 1 >= argc) return false;
      into = argv[++i];
      return true;
    };
    bool ok = true;
    if (a == "-h" || a == "--help") {
      std::fputs(kPreprocessUsage, stdout);
      return 0;
    } else if (a == "--input") ok = value(o.input);
    else if (a == "--output-prefix") ok = value(prefix);
    else if (a == "--tokenizer" || a == "--tokenizer-type") ok = value(t.kind);
    else if (a == "--vocab-file") ok = value(t.vocab_file);
    else if (a == "--merge-file") ok = value(t.merge_file);
    else if (a == "--tokenizer-model") ok = value(t.model_file);
    else if (a == "--json-key" || a == "--json-keys") ok = value(o.json_key);
    else if (a == "--input-format") ok = value(o.format);
    else if (a == "--append-eod") o.append_eod = true;
    else if (a == "--skip-bad-records") o.skip_bad_records = true;
    else if (a == "--no-progress") o.progress = false;
    else if (a == "--workers") {
      std::string v;
      char* end = nullptr;
      ok = value(v);
      const long n = ok ? std::strtol(v.c_str(), &end, 10) : 0;
      if (ok && (!end || *end || n < 1 || n > 1024)) return usage_error("--workers needs a number from 1 to 1024, got '" + v + "'");
      o.workers = static_cast<int>(n);
    } else {
      return usage_error("unknown argument '" + a + "'");
    }
    if (!ok) return usage_error(a + " needs a value");
  }
  if (o.input.empty()) return usage_error("--input is required");
  if (prefix.empty()) return usage_error("--output-prefix is required");
  if (t.kind == "GPT2BPETokenizer") t.kind = "gpt2";
  if (t.kind == "SentencePieceTokenizer" || t.kind == "Llama2Tokenizer" || t.kind == "GPTSentencePieceTokenizer") t.kind = "sentencepiece";
  if (t.kind.empty()) return usage_error("--tokenizer is required (gpt2 or sentencepiece)");
  if (t.kind == "gpt2" && t.vocab_file.empty()) t.vocab_file = asset_dir + "/gpt2-encoder.json";
  if (t.kind == "gpt2" && t.merge_file.empty()) t.merge_file = asset_dir + "/gpt2-vocab.bpe";
  o.output = o.format == "text" ? prefix + "_text_document" : megatron_output_prefix(prefix, o.json_key);
  try {
    const auto tok = make_tokenizer(t);
    const auto s = preprocess(o, *tok);
    std::printf("preprocess: %s -> %s.bin/.idx: %lld documents, %lld tokens, %lld skipped, %s MB in %s "
                "(%s, %d workers, %s)\n",
                o.input.c_str(), o.output.c_str(), static_cast<long long>(s.documents), static_cast<long long>(s.tokens),
                static_cast<long long>(s.skipped), human::number(static_cast<double>(s.bytes) / 1e6).c_str(),
                human::seconds(s.seconds).c_str(), human::rate(s.mb_per_s(), "MB/s").c_str(), o.workers,
                tok->describe().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "megaengine preprocess: %s\n", e.what());
    return 1;
  }
}

}  // namespace me::data
