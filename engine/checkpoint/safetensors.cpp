#include "engine/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/core/crc32c.h"
#include "engine/core/error.h"

namespace me::checkpoint {

namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {{DType::F64, "F64", 8}, {DType::F32, "F32", 4}, {DType::F16, "F16", 2},
                                 {DType::BF16, "BF16", 2}, {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
                                 {DType::I16, "I16", 2},  {DType::I8, "I8", 1},    {DType::U8, "U8", 1},
                                 {DType::BOOL, "BOOL", 1}};

const DTypeInfo& info(DType d) {
  for (const auto& i : kDTypes)
    if (i.dtype == d) return i;
  fail("unknown dtype");
}

// A header longer than this is not a checkpoint's (a 70B model's has about 10^4 tensors).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr size_t kChunk = 64u << 20;

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("cannot write '", path, "': ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what) {
  int64_t n = 1;
  for (const int64_t d : shape) {
    ME_CHECK(d >= 0, what, ": negative dimension ", d);
    ME_CHECK(d == 0 || n <= INT64_MAX / d, what, ": the shape's size overflows");
    n *= d;
  }
  return n;
}

}  // namespace

size_t dtype_size(DType d) { return info(d).size; }
const char* dtype_name(DType d) { return info(d).name; }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::optional<DType> parse_dtype(const std::string& name) {
  for (const auto& i : kDTypes)
    if (name == i.name) return i.dtype;
  return std::nullopt;
}

int64_t TensorEntry::numel() const { return checked_numel(shape, name); }

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<TensorSource>& tensors,
                                     const std::map<std::string, std::string>& metadata, const WriteOptions& options)
    : path_(path), options_(options) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(checked_numel(t.shape, t.name)) * dtype_size(t.dtype);
    ME_CHECK(!header.contains(t.name), "safetensors '", path, "': tensor '", t.name, "' given twice");
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    expected_.emplace_back(t.name, bytes);
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create '", path, "': ", std::strerror(errno));
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>((json.size() >> (8 * i)) & 0xff);
  put(length, 8);
  put(json.data(), json.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsWriter::put(const void* data, size_t n) {
  write_all(fd_, data, n, path_);
  result_.crc32c = crc32c(result_.crc32c, data, n);
  result_.bytes += n;
}

void SafetensorsWriter::append(const std::string& name, const void* data, uint64_t bytes) {
  ME_CHECK(fd_ >= 0 && next_ < expected_.size() && expected_[next_].first == name, "safetensors '", path_,
           "': tensor '", name, "' written out of order (expected '",
           next_ < expected_.size() ? expected_[next_].first : std::string("none: the file is complete"), "')");
  ME_CHECK(bytes == expected_[next_].second, "safetensors '", path_, "': tensor '", name, "' has ", bytes,
           " bytes, its header says ", expected_[next_].second);
  const auto* p = static_cast<const char*>(data);
  for (uint64_t done = 0; done < bytes; done += options_.chunk_bytes) {
    put(p + done, static_cast<size_t>(std::min<uint64_t>(options_.chunk_bytes, bytes - done)));
    if (options_.after_chunk) options_.after_chunk();
  }
  ++next_;
}

WriteResult SafetensorsWriter::finish() {
  ME_CHECK(fd_ >= 0 && next_ == expected_.size(), "safetensors '", path_, "': finished after ", next_, " of ",
           expected_.size(), " tensors");
  if (options_.fsync && ::fsync(fd_) != 0) fail("cannot fsync '", path_, "': ", std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot close '", path_, "': ", std::strerror(errno));
  return result_;
}

WriteResult write_safetensors(const std::string& path, const std::vector<TensorSource>& tensors,
                              const std::map<std::string, std::string>& metadata, const WriteOptions& options) {
  SafetensorsWriter writer(path, tensors, metadata, options);
  for (const auto& t : tensors)
    writer.append(t.name, t.data, static_cast<uint64_t>(checked_numel(t.shape, t.name)) * dtype_size(t.dtype));
  return writer.finish();
}

std::vector<TensorEntry> parse_header(const std::string& json, uint64_t data_bytes, const std::string& file,
                                      std::map<std::string, std::string>* metadata) {
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    fail("'", file, "' is not a safetensors file: its header is not JSON (", e.what(), ")");
  }
  ME_CHECK(h.is_object(), "'", file, "': the safetensors header is not a JSON object");
  std::vector<TensorEntry> out;
  for (const auto& [name, v] : h.items()) {
    const std::string what = cat("'", file, "': tensor '", name, "'");
    if (name == "__metadata__") {
      ME_CHECK(v.is_object(), "'", file, "': __metadata__ is not an object of strings");
      for (const auto& [k, s] : v.items()) {
        ME_CHECK(s.is_string(), "'", file, "': __metadata__.", k, " is not a string");
        if (metadata) (*metadata)[k] = s.get<std::string>();
      }
      continue;
    }
    ME_CHECK(v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"), what,
             ": expected {dtype, shape, data_offsets}");
    TensorEntry e;
    e.name = name;
    ME_CHECK(v["dtype"].is_string(), what, ": dtype is not a string");
    const auto dtype = parse_dtype(v["dtype"].get<std::string>());
    ME_CHECK(dtype, what, ": dtype '", v["dtype"].get<std::string>(), "' cannot be read (F64, F32, F16, BF16, I64, I32, ",
             "I16, I8, U8, BOOL)");
    e.dtype = *dtype;
    ME_CHECK(v["shape"].is_array(), what, ": shape is not an array");
    for (const auto& d : v["shape"]) {
      ME_CHECK(d.is_number_integer(), what, ": shape holds a non-integer");
      e.shape.push_back(d.get<int64_t>());
    }
    const auto& o = v["data_offsets"];
    ME_CHECK(o.is_array() && o.size() == 2 && o[0].is_number_unsigned() && o[1].is_number_unsigned(), what,
             ": data_offsets is not [begin, end]");
    e.begin = o[0].get<uint64_t>();
    e.end = o[1].get<uint64_t>();
    ME_CHECK(e.begin <= e.end, what, ": data_offsets [", e.begin, ", ", e.end,
             "] are reversed (begin after end; a corrupt header)");
    ME_CHECK(e.end <= data_bytes, what, ": its bytes [", e.begin, ", ", e.end,
             ") lie past the end of the file's ", data_bytes, " data bytes (a truncated or corrupt file)");
    const auto numel = static_cast<uint64_t>(checked_numel(e.shape, what));
    ME_CHECK(numel <= (e.end - e.begin) / dtype_size(e.dtype) && numel * dtype_size(e.dtype) == e.end - e.begin, what,
             ": shape and dtype make ", numel, " x ", dtype_size(e.dtype), " bytes, its range holds ", e.end - e.begin);
    out.push_back(std::move(e));
  }
  std::vector<const TensorEntry*> by_begin;
  for (const auto& e : out) by_begin.push_back(&e);
  std::sort(by_begin.begin(), by_begin.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_begin.size(); ++i)
    ME_CHECK(by_begin[i]->begin >= by_begin[i - 1]->end, "'", file, "': tensors '", by_begin[i - 1]->name, "' and '",
             by_begin[i]->name, "' overlap");
  return out;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail("cannot open checkpoint shard '", path, "': ", std::strerror(errno));
  try {
    struct stat st {};
    ME_CHECK(::fstat(fd_, &st) == 0, "cannot stat '", path, "': ", std::strerror(errno));
    file_bytes_ = static_cast<uint64_t>(st.st_size);
    ME_CHECK(file_bytes_ >= 8, "'", path, "' is truncated: ", file_bytes_, " bytes, not even a safetensors header length");
    unsigned char length[8];
    read_at(0, 8, length);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(length[i]) << (8 * i);
    ME_CHECK(n <= kMaxHeaderBytes && n <= file_bytes_ - 8, "'", path, "': its header claims ", n,
             " bytes, but the file has ", file_bytes_, " (a truncated or corrupt file)");
    std::string json(n, '\0');
    read_at(8, n, json.data());
    data_start_ = 8 + n;
    tensors_ = parse_header(json, file_bytes_ - data_start_, path, &metadata_);
    for (size_t i = 0; i < tensors_.size(); ++i) by_name_[tensors_[i].name] = i;
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const TensorEntry& SafetensorsFile::at(const std::string& name) const {
  const auto* e = find(name);
  ME_CHECK(e, "'", path_, "' has no tensor '", name, "'");
  return *e;
}

void SafetensorsFile::read_at(uint64_t at, uint64_t n, void* out) const {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, p, std::min<uint64_t>(n, 1u << 30), static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail("cannot read '", path_, "': ", std::strerror(errno));
    if (r == 0) fail("'", path_, "' ended early (truncated while being read?)");
    p += r;
    at += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
}

void SafetensorsFile::read(const TensorEntry& e, uint64_t offset, uint64_t n, void* out) const {
  ME_CHECK(offset <= e.bytes() && n <= e.bytes() - offset, "'", path_, "': read of ", n, " bytes at ", offset,
           " outside tensor '", e.name, "' (", e.bytes(), " bytes)");
  read_at(data_start_ + e.begin + offset, n, out);
}

uint32_t SafetensorsFile::crc32c() const {
  std::vector<char> buf(kChunk);
  uint32_t crc = 0;
  for (uint64_t at = 0; at < file_bytes_; at += buf.size()) {
    const auto n = std::min<uint64_t>(buf.size(), file_bytes_ - at);
    read_at(at, n, buf.data());
    crc = me::crc32c(crc, buf.data(), n);
  }
  return crc;
}

}  // namespace me::checkpoint
