// The safetensors format (Hugging Face's): an 8-byte little-endian header length N, N bytes of
// JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the tensors' raw little-endian bytes, offsets counted
// from the end of the header. Standard tools (safetensors, transformers) read what this
// writes. Reading never trusts a size or an offset from the file without checking it against
// the file's length, and never executes anything. Torch-free.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace me::checkpoint {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

size_t dtype_size(DType d);
const char* dtype_name(DType d);                         // "F32", "BF16", ...
std::optional<DType> parse_dtype(const std::string& name);
std::string shape_text(const std::vector<int64_t>& shape);  // "[4096, 1024]", for messages

struct TensorEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data section
  int64_t numel() const;
  uint64_t bytes() const { return end - begin; }
};

// What to write: a tensor's bytes in host memory (little-endian, row-major).
struct TensorSource {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

struct WriteOptions {
  bool fsync = true;
  size_t chunk_bytes = 64u << 20;  // tensor data is written in pieces of this size
  // Called after each chunk is written (a test hook: the kill test slows the writer down so
  // that a SIGKILL lands inside it).
  std::function<void()> after_chunk;
};

struct WriteResult {
  uint64_t bytes = 0;     // the whole file
  uint32_t crc32c = 0;    // of the whole file
};

// A safetensors file written one tensor at a time: the header (names, dtypes, shapes) first,
// then each tensor's bytes as they come, so that a conversion never holds every tensor at once.
class SafetensorsWriter {
 public:
  // Creates `path` (replacing it) and writes the header. `tensors`' data pointers are not read:
  // their bytes come through append(), in this order.
  SafetensorsWriter(const std::string& path, const std::vector<TensorSource>& tensors,
                    const std::map<std::string, std::string>& metadata = {}, const WriteOptions& options = {});
  ~SafetensorsWriter();  // closes; a file not finish()ed is incomplete (write into a temporary place)
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next tensor's bytes; me::Error when `name` is not the next one or `bytes` not its size.
  void append(const std::string& name, const void* data, uint64_t bytes);
  // After the last tensor: fsyncs (WriteOptions::fsync) and closes.
  WriteResult finish();

 private:
  void put(const void* data, size_t n);

  std::string path_;
  int fd_ = -1;
  WriteOptions options_;
  std::vector<std::pair<std::string, uint64_t>> expected_;  // name, bytes
  size_t next_ = 0;
  WriteResult result_;
};

// Writes `path` (replacing it) and fsyncs it. Throws me::Error naming the file.
WriteResult write_safetensors(const std::string& path, const std::vector<TensorSource>& tensors,
                              const std::map<std::string, std::string>& metadata = {}, const WriteOptions& options = {});

// The header's JSON parsed and checked against a data section of `data_bytes`: known dtypes,
// non-negative shapes whose size matches the byte range, ranges inside the data section and
// not overlapping. `file` names the file in messages. Throws me::Error.
std::vector<TensorEntry> parse_header(const std::string& json, uint64_t data_bytes, const std::string& file,
                                      std::map<std::string, std::string>* metadata = nullptr);

// A safetensors file opened for reading; the header is read and checked at once.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_bytes() const { return file_bytes_; }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorEntry* find(const std::string& name) const;
  const TensorEntry& at(const std::string& name) const;  // me::Error naming the file and tensor

  // `n` bytes of the tensor from byte `offset` of its data into `out`.
  void read(const TensorEntry& e, uint64_t offset, uint64_t n, void* out) const;
  void read(const TensorEntry& e, void* out) const { read(e, 0, e.bytes(), out); }
  // CRC-32C of the whole file, read from disk.
  uint32_t crc32c() const;

 private:
  void read_at(uint64_t at, uint64_t n, void* out) const;

  std::string path_;
  int fd_ = -1;
  uint64_t file_bytes_ = 0, data_start_ = 0;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace me::checkpoint
