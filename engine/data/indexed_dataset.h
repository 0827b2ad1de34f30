// Megatron-LM's indexed dataset: the token ids of many sequences back to back in "<prefix>.bin",
// and "<prefix>.idx" saying where each sequence starts, how long it is, and which sequences
// form a document. Byte-compatible with Megatron (shared/context/MEGATRON-FORMATS.md), so data
// preprocessed for Megatron trains here unchanged and ours trains there.
// Pure C++17 plus POSIX mmap: no LibTorch, so data tools and their tests build without it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace me::data {

// The .idx dtype codes (numpy dtypes in Megatron); the values are the on-disk codes.
enum class DType : uint8_t {
  uint8 = 1,
  int8 = 2,
  int16 = 3,
  int32 = 4,
  int64 = 5,
  float64 = 6,
  float32 = 7,
  uint16 = 8,
};

size_t dtype_size(DType t);       // bytes per token
const char* dtype_name(DType t);  // "uint16", ...
// Megatron's preprocessing rule: uint16 for vocabularies below 65500, else int32.
DType dtype_for_vocab(int64_t vocab);

namespace detail {
// A whole file mapped read-only; unmapped on destruction. Move-only, and moving keeps the
// address, so pointers into the mapping survive moving the owner.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // me::Error "cannot open 'path': <why>"
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};
}  // namespace detail

// Streaming writer. Sequences go to "<prefix>.bin.tmp" as they arrive; finalize() writes
// "<prefix>.idx.tmp" and renames both over the real names, so a crash or an exception never
// leaves a half-written dataset under the real name (an older dataset there stays intact).
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, DType dtype);
  // Without finalize(): closes and deletes the .tmp files, and touches nothing else.
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one sequence. Every value must fit the dtype (for float dtypes: an integer that
  // the type holds exactly); otherwise me::Error naming the value and dtype, and nothing of
  // this sequence is written, so the writer stays usable.
  void add_sequence(const int64_t* tokens, size_t n);
  void add_sequence(const std::vector<int64_t>& tokens) { add_sequence(tokens.data(), tokens.size()); }
  // Closes the current document: the sequences since the previous boundary form one document.
  // Calling it twice in a row makes an empty document, as Megatron allows.
  void end_document();
  // Closes a still-open document, writes the .idx and renames the files into place.
  void finalize();

  size_t sequences() const { return lengths_.size(); }
  DType dtype() const { return dtype_; }

 private:
  std::string prefix_;
  DType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> document_index_{0};
  std::vector<uint8_t> buffer_;  // one sequence narrowed to the dtype, reused
  bool finalized_ = false;
};

// Memory-mapped reader: zero-copy access to a sequence or a slice of one. The header and
// document index are checked at open; each sequence's place in the .bin is checked when it is
// accessed (cheap), plus the last one at open so a truncated .bin fails immediately.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);  // opens prefix.idx and prefix.bin

  const std::string& prefix() const { return prefix_; }
  size_t size() const { return size_; }  // number of sequences
  DType dtype() const { return dtype_; }
  int32_t length(size_t i) const;  // tokens in sequence i
  // As stored: the sequence where each document starts, then size(). Copied out of the
  // mapping at open because it is validated entry by entry anyway.
  const std::vector<int64_t>& document_index() const { return document_index_; }
  size_t documents() const { return document_index_.size() - 1; }
  // The document that sequence i belongs to (an index into documents()).
  size_t document_of(size_t i) const;
  const std::string& bin_path() const { return bin_path_; }

  // The first token of sequence i plus `offset` tokens, in the file's dtype; valid while the
  // dataset lives. offset == length(i) is allowed (an empty tail).
  const void* data(size_t i, size_t offset = 0) const;
  // Tokens [offset, offset + length) of sequence i (default: to its end), widened to int64.
  std::vector<int64_t> get(size_t i, size_t offset = 0, std::optional<size_t> length = {}) const;

 private:
  // Start of sequence i in the .bin and its length, after checking both against the files.
  const uint8_t* sequence(size_t i, size_t* length) const;
  // One pass over the index at open: every length >= 0, each sequence starting where the one
  // before it ends (no gaps, no overlaps), and all of them together exactly the .bin.
  void check_layout() const;

  std::string prefix_, idx_path_, bin_path_;
  detail::MappedFile idx_, bin_;
  DType dtype_ = DType::uint8;
  size_t size_ = 0;
  // Into idx_. Not aligned (the header is 34 bytes), so entries are read with memcpy.
  const uint8_t* lengths_ = nullptr;
  const uint8_t* pointers_ = nullptr;
  std::vector<int64_t> document_index_;
};

}  // namespace me::data
