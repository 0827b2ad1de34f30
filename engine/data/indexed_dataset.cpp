#include "engine/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "engine/core/error.h"

// The format is little-endian and we read and write it by copying native integers.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "indexed_dataset assumes a little-endian host");

namespace me::data {
namespace {

constexpr uint8_t kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr const char* kMagicText = "MMIDIDX\\x00\\x00 (bytes 4D 4D 49 44 49 44 58 00 00)";
constexpr uint64_t kVersion = 1;
// magic 9 + version 8 + dtype 1 + sequence count 8 + document index entries 8
constexpr size_t kHeaderBytes = 34;
constexpr const char* kValidCodes =
    "1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16";

bool valid_code(uint8_t code) { return code >= 1 && code <= 8; }

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Inclusive range of int64 values a dtype holds exactly. For the float dtypes that is the run
// of integers without gaps (2^24, 2^53): a token id must come back as the same id.
struct Range {
  int64_t lo, hi;
};
Range value_range(DType t) {
  switch (t) {
    case DType::uint8: return {0, UINT8_MAX};
    case DType::int8: return {INT8_MIN, INT8_MAX};
    case DType::int16: return {INT16_MIN, INT16_MAX};
    case DType::int32: return {INT32_MIN, INT32_MAX};
    case DType::int64: return {INT64_MIN, INT64_MAX};
    case DType::float64: return {-(int64_t{1} << 53), int64_t{1} << 53};
    case DType::float32: return {-(int64_t{1} << 24), int64_t{1} << 24};
    case DType::uint16: return {0, UINT16_MAX};
  }
  fail("invalid dtype code ", int(t), "; valid codes are ", kValidCodes);
}

template <typename T>
void narrow_into(const int64_t* v, size_t n, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) {
    const T x = static_cast<T>(v[i]);
    std::memcpy(out + i * sizeof(T), &x, sizeof(T));
  }
}

template <typename T>
void widen_into(const uint8_t* p, size_t n, int64_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<int64_t>(load<T>(p + i * sizeof(T)));
}

// Float tokens are widened only when they are integers in int64 range: anything else is
// not a token id, and casting it would be undefined behaviour.
template <typename T>
void widen_float_into(const uint8_t* p, size_t n, int64_t* out, const std::string& path) {
  for (size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(load<T>(p + i * sizeof(T)));
    if (!(x >= -0x1p63 && x < 0x1p63) || x != std::trunc(x))
      fail("'", path, "' holds the value ", x, ", which is not an integer token id");
    out[i] = static_cast<int64_t>(x);
  }
}

// Writes and fsyncs; the data must be on disk before rename() makes it visible.
void flush_and_close(std::FILE*& f, const std::string& path) {
  const bool ok = std::fflush(f) == 0 && !std::ferror(f) && ::fsync(::fileno(f)) == 0;
  const int err = errno;
  const bool closed = std::fclose(f) == 0;
  f = nullptr;
  if (!ok || !closed) fail("cannot write '", path, "': ", std::strerror(ok ? errno : err));
}

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::uint8:
    case DType::int8: return 1;
    case DType::int16:
    case DType::uint16: return 2;
    case DType::int32:
    case DType::float32: return 4;
    case DType::int64:
    case DType::float64: return 8;
  }
  fail("invalid dtype code ", int(t), "; valid codes are ", kValidCodes);
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::uint8: return "uint8";
    case DType::int8: return "int8";
    case DType::int16: return "int16";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::float64: return "float64";
    case DType::float32: return "float32";
    case DType::uint16: return "uint16";
  }
  return "invalid";
}

DType dtype_for_vocab(int64_t vocab) {
  ME_CHECK(vocab > 0, "vocabulary size must be positive, got ", vocab);
  return vocab < 65500 ? DType::uint16 : DType::int32;
}

// ---- MappedFile ----

namespace detail {

MappedFile::MappedFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot stat '", path, "': ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("cannot open '", path, "': not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  // mmap rejects length 0, and an empty .bin (a dataset of empty sequences) is legal.
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping keeps the file alive
    if (p == MAP_FAILED) fail("cannot map '", path, "': ", std::strerror(err));
    data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace detail

// ---- writer ----

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, DType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  dtype_size(dtype_);  // rejects a code outside the enum
  const std::string path = prefix_ + ".bin.tmp";
  bin_ = std::fopen(path.c_str(), "wb");
  if (!bin_) fail("cannot create '", path, "': ", std::strerror(errno));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_) std::fclose(bin_);
  if (!finalized_) {
    std::remove((prefix_ + ".bin.tmp").c_str());
    std::remove((prefix_ + ".idx.tmp").c_str());
  }
}

void IndexedDatasetWriter::add_sequence(const int64_t* tokens, size_t n) {
  const std::string path = prefix_ + ".bin.tmp";
  ME_CHECK(!finalized_, "cannot add to '", prefix_, "': the writer is already finalized");
  ME_CHECK(n <= size_t{INT32_MAX}, "sequence of ", n, " tokens for '", path,
           "' is longer than the format's int32 length allows; split it");
  // Check the whole sequence before writing any of it, so a bad value leaves no trace.
  const Range r = value_range(dtype_);
  for (size_t i = 0; i < n; ++i)
    if (tokens[i] < r.lo || tokens[i] > r.hi)
      fail("token ", tokens[i], " (position ", i, " of sequence ", lengths_.size(),
           ") does not fit dtype ", dtype_name(dtype_), " [", r.lo, ", ", r.hi, "] writing '",
           path, "'; use a wider dtype (int32 for vocabularies of 65500 or more)");
  buffer_.resize(n * dtype_size(dtype_));
  switch (dtype_) {
    case DType::uint8: narrow_into<uint8_t>(tokens, n, buffer_.data()); break;
    case DType::int8: narrow_into<int8_t>(tokens, n, buffer_.data()); break;
    case DType::int16: narrow_into<int16_t>(tokens, n, buffer_.data()); break;
    case DType::int32: narrow_into<int32_t>(tokens, n, buffer_.data()); break;
    case DType::int64: narrow_into<int64_t>(tokens, n, buffer_.data()); break;
    case DType::float64: narrow_into<double>(tokens, n, buffer_.data()); break;
    case DType::float32: narrow_into<float>(tokens, n, buffer_.data()); break;
    case DType::uint16: narrow_into<uint16_t>(tokens, n, buffer_.data()); break;
  }
  // A short write leaves the stream's error flag set; finalize() then refuses to publish.
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), bin_) != buffer_.size())
    fail("cannot write '", path, "': ", std::strerror(errno));
  lengths_.push_back(static_cast<int32_t>(n));
}

void IndexedDatasetWriter::end_document() {
  ME_CHECK(!finalized_, "cannot end a document of '", prefix_, "': the writer is already finalized");
  document_index_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::finalize() {
  ME_CHECK(!finalized_, "'", prefix_, "' is already finalized");
  const std::string bin_tmp = prefix_ + ".bin.tmp", idx_tmp = prefix_ + ".idx.tmp";
  // Trailing sequences with no end_document() still belong to a document: Megatron's reader
  // requires the document index to end at the sequence count.
  if (document_index_.back() != static_cast<int64_t>(lengths_.size())) end_document();
  flush_and_close(bin_, bin_tmp);

  std::FILE* idx = std::fopen(idx_tmp.c_str(), "wb");
  if (!idx) fail("cannot create '", idx_tmp, "': ", std::strerror(errno));
  // Write errors are caught by the ferror() in flush_and_close().
  auto put = [&](const void* p, size_t n) {
    if (n > 0) std::fwrite(p, 1, n, idx);
  };
  const uint8_t code = static_cast<uint8_t>(dtype_);
  const uint64_t sequences = lengths_.size(), entries = document_index_.size();
  put(kMagic, sizeof kMagic);
  put(&kVersion, 8);
  put(&code, 1);
  put(&sequences, 8);
  put(&entries, 8);
  put(lengths_.data(), lengths_.size() * sizeof(int32_t));
  // Pointers are byte offsets, each the running sum of the previous sequences' bytes.
  std::vector<int64_t> pointers(lengths_.size());
  int64_t offset = 0;
  for (size_t i = 0; i < lengths_.size(); ++i) {
    pointers[i] = offset;
    offset += int64_t{lengths_[i]} * static_cast<int64_t>(dtype_size(dtype_));
  }
  put(pointers.data(), pointers.size() * sizeof(int64_t));
  put(document_index_.data(), document_index_.size() * sizeof(int64_t));
  flush_and_close(idx, idx_tmp);

  // .bin first, .idx last: readers open the .idx first, so it appearing is the commit point.
  for (const char* ext : {".bin", ".idx"}) {
    const std::string from = prefix_ + ext + ".tmp", to = prefix_ + ext;
    if (std::rename(from.c_str(), to.c_str()) != 0)
      fail("cannot rename '", from, "' to '", to, "': ", std::strerror(errno));
  }
  finalized_ = true;
}

// ---- reader ----

IndexedDataset::IndexedDataset(const std::string& prefix)
    : prefix_(prefix), idx_path_(prefix + ".idx"), bin_path_(prefix + ".bin") {
  try {
    idx_ = detail::MappedFile(idx_path_);
  } catch (const Error& e) {
    // The usual slip: naming a file ("x.bin") where the prefix ("x") is expected.
    const std::string ext = prefix.size() >= 4 ? prefix.substr(prefix.size() - 4) : "";
    if (ext == ".bin" || ext == ".idx")
      fail(e.what(), "; datasets are named by prefix, without the ", ext, " extension");
    throw;
  }
  const uint8_t* p = idx_.data();
  const size_t n = idx_.size();
  if (n >= sizeof kMagic && std::memcmp(p, kMagic, sizeof kMagic) != 0)
    fail("'", idx_path_, "' does not start with the Megatron index magic ", kMagicText,
         "; it is probably not a Megatron .idx file");
  if (n < kHeaderBytes)
    fail("'", idx_path_, "' is truncated: ", n, " bytes, but a Megatron index header alone needs ",
         kHeaderBytes);
  const uint64_t version = load<uint64_t>(p + 9);
  ME_CHECK(version == kVersion, "'", idx_path_, "' has index version ", version,
           "; only version ", kVersion, " is supported");
  const uint8_t code = p[17];
  ME_CHECK(valid_code(code), "'", idx_path_, "' has unknown dtype code ", int(code),
           "; valid codes are ", kValidCodes);
  dtype_ = static_cast<DType>(code);

  // The counts come from the file: compute the size they need without overflowing.
  const uint64_t sequences = load<uint64_t>(p + 18), entries = load<uint64_t>(p + 26);
  uint64_t a = 0, b = 0, need = 0;
  const bool overflow = __builtin_mul_overflow(sequences, uint64_t{12}, &a) ||
                        __builtin_mul_overflow(entries, uint64_t{8}, &b) ||
                        __builtin_add_overflow(a, b, &need) ||
                        __builtin_add_overflow(need, uint64_t{kHeaderBytes}, &need);
  // Bytes past `need` are allowed: multimodal indexes append one mode byte per sequence.
  if (overflow || need > n)
    fail("'", idx_path_, "' is truncated: ", n, " bytes, but its header declares ", sequences,
         " sequences and ", entries, " document index entries, which need ",
         overflow ? std::string("more than 2^64") : std::to_string(need),
         " bytes; re-run the preprocessing that made it");
  ME_CHECK(entries > 0, "'", idx_path_,
           "' has an empty document index; it must hold at least the entry 0");
  size_ = static_cast<size_t>(sequences);
  lengths_ = p + kHeaderBytes;
  pointers_ = lengths_ + 4 * size_;

  document_index_.resize(static_cast<size_t>(entries));
  std::memcpy(document_index_.data(), pointers_ + 8 * size_, document_index_.size() * 8);
  ME_CHECK(document_index_[0] == 0, "'", idx_path_, "' has a document index starting at ",
           document_index_[0], " instead of 0; the index is corrupt");
  for (size_t k = 1; k < document_index_.size(); ++k)
    ME_CHECK(document_index_[k] >= document_index_[k - 1], "'", idx_path_,
             "' has a document index that is not non-decreasing: entry ", k, " is ",
             document_index_[k], " after ", document_index_[k - 1], "; the index is corrupt");
  ME_CHECK(document_index_.back() == static_cast<int64_t>(size_), "'", idx_path_,
           "' has a document index that does not end at the sequence count: last entry ",
           document_index_.back(), ", sequence count ", size_, "; the index is corrupt");

  bin_ = detail::MappedFile(bin_path_);
  check_layout();
}

// Megatron writes the sequences back to back in index order, so sequence i starts at the sum
// of the lengths before it. Linear and branch-light: 12 bytes per sequence, read once.
void IndexedDataset::check_layout() const {
  const uint64_t item = dtype_size(dtype_), total = bin_.size();
  uint64_t end = 0;  // bytes of the sequences so far; never above total, so no overflow
  for (size_t i = 0; i < size_; ++i) {
    const int32_t n = load<int32_t>(lengths_ + 4 * i);
    const int64_t at = load<int64_t>(pointers_ + 8 * i);
    if (n < 0)
      fail("'", idx_path_, "' gives sequence ", i, " the negative length ", n,
           "; the index is corrupt: re-run the preprocessing that made it");
    if (at != static_cast<int64_t>(end))
      fail("'", idx_path_, "' puts sequence ", i, " at byte ", at, " of '", bin_path_, "', but the sequences before it end at byte ",
           end, " (they must follow each other without gaps or overlaps); the index is corrupt or belongs to another ",
           ".bin: re-run the preprocessing that made it");
    if ((total - end) / item < static_cast<uint64_t>(n))
      fail("'", bin_path_, "' is truncated or does not belong to '", idx_path_, "': it is ", total,
           " bytes, but the index puts sequence ", i, " (", n, " tokens of ", item, " bytes) at byte ", at);
    end += static_cast<uint64_t>(n) * item;
  }
  if (end != total)
    fail("'", bin_path_, "' is ", total, " bytes, but the ", size_, " sequences of '", idx_path_, "' hold ", end,
         " bytes: the .bin does not belong to this index (an index of a smaller dataset?); re-run the preprocessing ",
         "that made them, or give the prefix of the matching pair");
}

int32_t IndexedDataset::length(size_t i) const {
  ME_CHECK(i < size_, "sequence ", i, " is out of range: '", bin_path_, "' holds ", size_,
           " sequences");
  return load<int32_t>(lengths_ + 4 * i);
}

const uint8_t* IndexedDataset::sequence(size_t i, size_t* length) const {
  const int32_t n = this->length(i);
  const int64_t at = load<int64_t>(pointers_ + 8 * i);
  const size_t item = dtype_size(dtype_);
  ME_CHECK(n >= 0, "'", idx_path_, "' gives sequence ", i, " the negative length ", n,
           "; the index is corrupt");
  // at + n * item <= size, written so that nothing overflows.
  if (at < 0 || static_cast<uint64_t>(at) > bin_.size() ||
      (bin_.size() - static_cast<uint64_t>(at)) / item < static_cast<uint64_t>(n))
    fail("'", bin_path_, "' is truncated or does not belong to '", idx_path_, "': it is ",
         bin_.size(), " bytes, but the index puts sequence ", i, " (", n, " tokens of ", item,
         " bytes) at byte ", at);
  *length = static_cast<size_t>(n);
  return bin_.data() + at;
}

size_t IndexedDataset::document_of(size_t i) const {
  ME_CHECK(i < size_, "sequence ", i, " is out of range: '", bin_path_, "' holds ", size_, " sequences");
  // The last document start <= i (empty documents share their start with the next one).
  const auto it = std::upper_bound(document_index_.begin(), document_index_.end(), static_cast<int64_t>(i));
  return static_cast<size_t>(it - document_index_.begin()) - 1;
}

const void* IndexedDataset::data(size_t i, size_t offset) const {
  size_t n = 0;
  const uint8_t* p = sequence(i, &n);
  ME_CHECK(offset <= n, "offset ", offset, " is past the end of sequence ", i, " (", n,
           " tokens) in '", bin_path_, "'");
  return p + offset * dtype_size(dtype_);
}

std::vector<int64_t> IndexedDataset::get(size_t i, size_t offset,
                                         std::optional<size_t> length) const {
  size_t n = 0;
  const uint8_t* p = sequence(i, &n);
  ME_CHECK(offset <= n, "offset ", offset, " is past the end of sequence ", i, " (", n,
           " tokens) in '", bin_path_, "'");
  const size_t count = length.value_or(n - offset);
  ME_CHECK(count <= n - offset, "slice of ", count, " tokens at offset ", offset,
           " is past the end of sequence ", i, " (", n, " tokens) in '", bin_path_, "'");
  p += offset * dtype_size(dtype_);
  std::vector<int64_t> out(count);
  switch (dtype_) {
    case DType::uint8: widen_into<uint8_t>(p, count, out.data()); break;
    case DType::int8: widen_into<int8_t>(p, count, out.data()); break;
    case DType::int16: widen_into<int16_t>(p, count, out.data()); break;
    case DType::int32: widen_into<int32_t>(p, count, out.data()); break;
    case DType::int64: widen_into<int64_t>(p, count, out.data()); break;
    case DType::float64: widen_float_into<double>(p, count, out.data(), bin_path_); break;
    case DType::float32: widen_float_into<float>(p, count, out.data(), bin_path_); break;
    case DType::uint16: widen_into<uint16_t>(p, count, out.data()); break;
  }
  return out;
}

}  // namespace me::data
