#include "engine/data/gpt2_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/utf8.h"

namespace me::data {

namespace {

// GPT-2's pre-tokenizer, with \s widened to Unicode White_Space: PCRE2's \s (under PCRE2_UCP) is
// Perl space, which lacks U+0085 (NEL); Python's and tiktoken's \s have it.
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\x{85}\p{L}\p{N}]+|[\s\x{85}]+(?![^\s\x{85}])|[\s\x{85}]+)";

// Pieces longer than this are encoded but not cached (rare, and they would bloat the cache).
constexpr size_t kMaxCachedPiece = 64;
// Pieces up to this many bytes take bpe()'s plain scan (fastest for words); longer ones the
// heap (bpe_long), whose time grows as n log n instead of n x merges.
constexpr size_t kScanLimit = 64;
constexpr size_t kCacheCapacity = 1 << 18;  // entries per thread before its cache is cleared

// Tells tokenizers apart for the per-thread caches (an address could be reused).
std::atomic<uint64_t> next_tokenizer_id{1};

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open GPT-2 ", what, " '", path, "': ", std::strerror(errno));
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("cannot read GPT-2 ", what, " '", path, "'");
  return s;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes one UTF-8 code point at s[i], advancing i; returns false on a malformed sequence.
bool next_utf8(std::string_view s, size_t& i, uint32_t& cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  int extra;
  if (c < 0x80) { cp = c; extra = 0; }
  else if ((c & 0xE0) == 0xC0) { cp = c & 0x1F; extra = 1; }
  else if ((c & 0xF0) == 0xE0) { cp = c & 0x0F; extra = 2; }
  else if ((c & 0xF8) == 0xF0) { cp = c & 0x07; extra = 3; }
  else return false;
  if (i + static_cast<size_t>(extra) >= s.size()) return false;
  for (int k = 1; k <= extra; ++k) {
    const auto d = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
    if ((d & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (d & 0x3F);
  }
  i += static_cast<size_t>(extra) + 1;
  return true;
}

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes
// (controls, space, DEL, NBSP, soft hyphen...) for code points 256, 257, ... in byte order.
std::array<uint32_t, 256> byte_to_unicode() {
  std::array<uint32_t, 256> table{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = printable ? b : next++;
  }
  return table;
}

struct PcreCodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct PcreMatchDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

struct Merge {
  int32_t rank;
  int32_t id;
};

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

struct GPT2Tokenizer::Impl {
  std::vector<std::string> id_bytes;        // id -> the bytes it stands for
  std::array<int32_t, 256> byte_id{};       // byte -> id of its one-byte token
  std::unordered_map<uint64_t, Merge> merges;  // (left id, right id) -> rank and merged id
  int64_t eod = -1;
  std::unique_ptr<pcre2_code, PcreCodeDeleter> regex;

  const uint64_t id = next_tokenizer_id++;

  void load_encoder(const std::string& path);
  void load_merges(const std::string& path);
  void compile_regex();
  void bpe(std::string_view piece, std::vector<int32_t>& syms) const;
  void bpe_long(std::vector<int32_t>& syms) const;
  void encode_piece(std::string_view piece, std::vector<int64_t>& out) const;
};

void GPT2Tokenizer::Impl::load_encoder(const std::string& path) {
  const std::string text = read_file(path, "encoder.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("GPT-2 encoder.json '", path, "' is not valid JSON: ", e.what());
  }
  ME_CHECK(j.is_object() && !j.empty(), "GPT-2 encoder.json '", path,
           "' must be a non-empty JSON object mapping tokens to ids");

  std::array<int32_t, 324> unicode_to_byte;
  unicode_to_byte.fill(-1);
  const auto b2u = byte_to_unicode();
  for (int b = 0; b < 256; ++b) unicode_to_byte[b2u[static_cast<size_t>(b)]] = b;

  const size_t n = j.size();
  id_bytes.assign(n, std::string());
  std::vector<bool> seen(n, false);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& token = it.key();
    ME_CHECK(it.value().is_number_integer(), "GPT-2 encoder.json '", path, "': the id of token '",
             token, "' is not an integer");
    const auto id = it.value().get<int64_t>();
    ME_CHECK(id >= 0 && id < static_cast<int64_t>(n), "GPT-2 encoder.json '", path, "': token '", token,
             "' has id ", id, ", outside [0, ", n, ") for ", n, " tokens");
    ME_CHECK(!seen[static_cast<size_t>(id)], "GPT-2 encoder.json '", path, "': id ", id,
             " is used by more than one token (second: '", token, "')");
    seen[static_cast<size_t>(id)] = true;
    std::string bytes;
    size_t i = 0;
    while (i < token.size()) {
      uint32_t cp = 0;
      ME_CHECK(next_utf8(token, i, cp), "GPT-2 encoder.json '", path, "': token with id ", id,
               " is not valid UTF-8");
      ME_CHECK(cp < unicode_to_byte.size() && unicode_to_byte[cp] >= 0, "GPT-2 encoder.json '", path,
               "': token '", token, "' (id ", id, ") has character U+", std::hex, cp, std::dec,
               ", which is not in GPT-2's byte-to-unicode table");
      bytes += static_cast<char>(unicode_to_byte[cp]);
    }
    ME_CHECK(!bytes.empty(), "GPT-2 encoder.json '", path, "': empty token for id ", id);
    id_bytes[static_cast<size_t>(id)] = std::move(bytes);
    if (token == "<|endoftext|>") eod = id;
  }
  ME_CHECK(eod >= 0, "GPT-2 encoder.json '", path, "' has no \"<|endoftext|>\" token");
  byte_id.fill(-1);
  for (size_t id = 0; id < n; ++id)
    if (id_bytes[id].size() == 1) byte_id[static_cast<unsigned char>(id_bytes[id][0])] = static_cast<int32_t>(id);
  for (int b = 0; b < 256; ++b)
    ME_CHECK(byte_id[static_cast<size_t>(b)] >= 0, "GPT-2 encoder.json '", path,
             "' has no token for byte ", b, ": a byte-level BPE vocabulary needs all 256");
}

void GPT2Tokenizer::Impl::load_merges(const std::string& path) {
  const std::string text = read_file(path, "vocab.bpe");
  std::unordered_map<std::string, int32_t> unicode_id;  // the merge file's spelling -> id
  {
    const auto b2u = byte_to_unicode();
    unicode_id.reserve(id_bytes.size());
    for (size_t id = 0; id < id_bytes.size(); ++id) {
      std::string u;
      for (unsigned char c : id_bytes[id]) append_utf8(u, b2u[c]);
      unicode_id.emplace(std::move(u), static_cast<int32_t>(id));
    }
  }
  size_t pos = 0;
  int64_t line_no = 0;
  int32_t rank = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (line_no == 1 && line[0] == '#') continue;  // "#version: 0.2"
    const size_t sp = line.find(' ');
    ME_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                 line.find(' ', sp + 1) == std::string_view::npos,
             "GPT-2 vocab.bpe '", path, "' line ", line_no,
             ": expected a merge, two tokens separated by one space, got '",
             std::string(line.substr(0, 80)), line.size() > 80 ? "...'" : "'");
    const std::string left(line.substr(0, sp)), right(line.substr(sp + 1));
    const auto l = unicode_id.find(left), r = unicode_id.find(right), m = unicode_id.find(left + right);
    ME_CHECK(l != unicode_id.end() && r != unicode_id.end() && m != unicode_id.end(), "GPT-2 vocab.bpe '",
             path, "' line ", line_no, ": merge '", left, " ", right,
             "' uses or makes a token that the encoder.json does not have (wrong pair of files?)");
    merges.emplace(pair_key(l->second, r->second), Merge{rank, m->second});  // first one wins
    ++rank;
  }
}

void GPT2Tokenizer::Impl::compile_regex() {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  regex.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr));
  if (!regex) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("GPT-2 tokenizer: PCRE2 cannot compile the pre-tokenizer regex at offset ", err_off, ": ",
         reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(regex.get(), PCRE2_JIT_COMPLETE);  // falls back to the interpreter if no JIT
}

// Applies the merges to one piece as GPT-2's bpe() does: repeatedly take the adjacent pair of
// lowest rank and merge every occurrence of it, left to right. `syms` receives the ids.
void GPT2Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& syms) const {
  syms.clear();
  for (unsigned char c : piece) syms.push_back(byte_id[c]);
  if (syms.size() > kScanLimit) return bpe_long(syms);
  while (syms.size() >= 2) {
    int32_t best_rank = INT32_MAX;
    int32_t a = -1, b = -1, merged = -1;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      const auto it = merges.find(pair_key(syms[i], syms[i + 1]));
      if (it != merges.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        a = syms[i];
        b = syms[i + 1];
        merged = it->second.id;
      }
    }
    if (merged < 0) break;
    size_t w = 0;
    for (size_t i = 0; i < syms.size();) {
      if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
        syms[w++] = merged;
        i += 2;
      } else {
        syms[w++] = syms[i++];
      }
    }
    syms.resize(w);
  }
}

// The same merges in O(n log n) for long pieces (a run of letters without spaces can be
// megabytes; the scan above is O(n) per distinct merge). The symbols form a linked list; a heap
// holds every adjacent pair that has a merge, by (rank, position). A rank names one pair, so
// popping all entries of the lowest rank gives that pair's occurrences left to right: merged in
// that order, skipping those a merge just consumed, they are exactly bpe()'s pass. Pairs the
// merges create go on the heap for later passes (never this one: a new pair is never (a, b)).
void GPT2Tokenizer::Impl::bpe_long(std::vector<int32_t>& syms) const {
  struct Entry {
    int32_t rank;
    uint32_t left;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  const auto n = static_cast<uint32_t>(syms.size());
  constexpr uint32_t kNone = UINT32_MAX;
  std::vector<uint32_t> prev(n), next(n);
  for (uint32_t i = 0; i < n; ++i) {
    prev[i] = i == 0 ? kNone : i - 1;
    next[i] = i + 1 == n ? kNone : i + 1;
  }
  auto rank_at = [&](uint32_t left) -> const Merge* {  // the merge of (left, next[left]), if any
    if (left == kNone || next[left] == kNone) return nullptr;
    const auto it = merges.find(pair_key(syms[left], syms[next[left]]));
    return it == merges.end() ? nullptr : &it->second;
  };
  std::vector<Entry> heap;
  std::vector<uint32_t> pass;
  auto push = [&](uint32_t left) {
    if (const Merge* m = rank_at(left)) {
      heap.push_back({m->rank, left});
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const int32_t rank = heap.front().rank;
    pass.clear();
    while (!heap.empty() && heap.front().rank == rank) {
      pass.push_back(heap.front().left);
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      heap.pop_back();
    }
    for (uint32_t left : pass) {
      if (syms[left] < 0) continue;     // consumed by a merge of this pass
      const Merge* m = rank_at(left);  // changed since it was pushed: skip it
      if (!m || m->rank != rank) continue;
      const uint32_t right = next[left];
      syms[left] = m->id;
      syms[right] = -1;  // dead
      next[left] = next[right];
      if (next[left] != kNone) prev[next[left]] = left;
      push(prev[left]);
      push(left);
    }
  }
  size_t w = 0;
  for (uint32_t i = 0; i != kNone && n > 0; i = next[i]) syms[w++] = syms[i];
  syms.resize(w);
}

void GPT2Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int64_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  thread_local std::vector<int32_t> syms;
  if (piece.size() > kMaxCachedPiece) {
    bpe(piece, syms);
    out.insert(out.end(), syms.begin(), syms.end());
    return;
  }
  // Each thread caches the pieces it has encoded: preprocessing workers never wait on each other.
  struct Cache {
    uint64_t owner = 0;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };
  thread_local Cache cache;
  if (cache.owner != id) {
    cache.owner = id;
    cache.words.clear();
  }
  std::string key(piece);
  if (const auto it = cache.words.find(key); it != cache.words.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  bpe(piece, syms);
  out.insert(out.end(), syms.begin(), syms.end());
  if (cache.words.size() >= kCacheCapacity) cache.words.clear();
  cache.words.emplace(std::move(key), syms);
}

GPT2Tokenizer::GPT2Tokenizer(const std::string& encoder_json, const std::string& vocab_bpe)
    : impl_(std::make_unique<Impl>()) {
  impl_->load_encoder(encoder_json);
  impl_->load_merges(vocab_bpe);
  impl_->compile_regex();
}

GPT2Tokenizer::~GPT2Tokenizer() = default;
GPT2Tokenizer::GPT2Tokenizer(GPT2Tokenizer&&) noexcept = default;
GPT2Tokenizer& GPT2Tokenizer::operator=(GPT2Tokenizer&&) noexcept = default;

void GPT2Tokenizer::encode_into(const std::string& text, std::vector<int64_t>& out) const {
  ME_CHECK(impl_, "GPT2Tokenizer used after being moved from");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const PCRE2_SIZE len = text.size();
  std::unique_ptr<pcre2_match_data, PcreMatchDeleter> md(
      pcre2_match_data_create_from_pattern(impl_->regex.get(), nullptr));
  ME_CHECK(md, "GPT-2 tokenizer: out of memory for PCRE2 match data");
  PCRE2_SIZE offset = 0;
  while (offset < len) {
    const int rc = pcre2_match(impl_->regex.get(), subject, len, offset, 0, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {  // only invalid UTF-8 is left
      impl_->encode_piece(std::string_view(text).substr(offset), out);
      break;
    }
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("GPT-2 tokenizer: PCRE2 match failed at byte ", offset, ": ", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const PCRE2_SIZE start = ov[0], end = ov[1];
    ME_CHECK(end > start && start >= offset, "GPT-2 tokenizer: empty regex match at byte ", start);
    if (start > offset)  // bytes skipped by the regex: invalid UTF-8
      impl_->encode_piece(std::string_view(text).substr(offset, start - offset), out);
    impl_->encode_piece(std::string_view(text).substr(start, end - start), out);
    offset = end;
  }
}

std::string GPT2Tokenizer::decode(const std::vector<int64_t>& ids) const { return utf8::repair(decode_bytes(ids)); }

std::string GPT2Tokenizer::decode_bytes(const std::vector<int64_t>& ids) const {
  ME_CHECK(impl_, "GPT2Tokenizer used after being moved from");
  std::string out;
  out.reserve(ids.size() * 4);
  const auto n = static_cast<int64_t>(impl_->id_bytes.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    ME_CHECK(id >= 0 && id < n, "GPT-2 decode: token ", i, " is id ", id, ", outside the vocabulary [0, ", n, ")");
    out += impl_->id_bytes[static_cast<size_t>(id)];
  }
  return out;
}

int64_t GPT2Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_bytes.size()); }
int64_t GPT2Tokenizer::eod() const { return impl_->eod; }
std::string GPT2Tokenizer::describe() const {
  return "gpt2 byte-level BPE (" + std::to_string(vocab_size()) + " ids, eod " + std::to_string(eod()) + ")";
}

}  // namespace me::data
