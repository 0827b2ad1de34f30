// One rank's part of a checkpoint as tensors, and the two directions: its pieces copied to the
// host and written as a safetensors shard; and, on load, each piece assembled from whatever
// layout the checkpoint was saved in (metadata.h describes the pieces).
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/checkpoint/metadata.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/parallel/state_tensor.h"

namespace me::checkpoint {

// A piece of a global tensor that this rank holds (parallel/state_tensor.h).
using StateTensor = parallel::StateTensor;

DType dtype_of(torch::ScalarType t);
torch::ScalarType scalar_type_of(DType d);

// The pieces of `tensors` that this rank saves, as metadata records in shard file `file`.
Metadata describe_pieces(const std::vector<StateTensor>& tensors, const std::string& file);

// Host copies of the tensors a rank saves (pinned when they live on a GPU), kept between saves
// so that each save allocates nothing: copying into them is an async save's only pause.
class HostSnapshot {
 public:
  // Allocates the host buffers for `tensors` (pinned allocation of many GB takes seconds: done
  // ahead of the first save, on a thread of the caller's).
  void prepare(const std::vector<StateTensor>& tensors);
  // Copies every tensor with save = true; returns the bytes copied.
  int64_t take(const std::vector<StateTensor>& tensors);
  // Writes them as one safetensors shard.
  WriteResult write(const std::string& path, const WriteOptions& options) const;

 private:
  // The buffer for the k-th saved tensor, (re)allocated when its name, shape or dtype changed.
  torch::Tensor& buffer(size_t k, const std::string& name, const torch::Tensor& like);

  std::vector<std::string> names_;
  std::vector<torch::Tensor> host_;
};

// A committed checkpoint opened for loading: its metadata, and each tensor assembled from its
// pieces into this rank's piece of it, whatever layout saved it. Every shard file read is
// checked first against the metadata's size and CRC-32C.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& iteration_dir);
  ~CheckpointReader();

  const Metadata& metadata() const { return meta_; }
  const std::string& path() const { return dir_; }
  bool has(const std::string& name) const { return meta_.tensors.count(name) > 0; }
  // Fills target.tensor with its piece of tensor `source` (default: target.name). me::Error
  // naming the tensor when the checkpoint lacks it or its shape differs (another model).
  void load(const StateTensor& target, const std::string& source = "");
  // Every shard's size and checksum (megaengine checkpoint inspect --verify).
  void verify_all();

 private:
  const SafetensorsFile& shard(const std::string& file);
  // The saved slice `slice` of tensor `name` (all its flat pieces put together), on the CPU.
  torch::Tensor read_slice(const std::string& name, const TensorRecord& record, const Piece& slice);

  std::string dir_;
  Metadata meta_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
};

}  // namespace me::checkpoint
