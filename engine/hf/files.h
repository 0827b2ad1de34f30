// The files of a Hugging Face model directory: its weights as one model.safetensors or as shards
// listed by model.safetensors.index.json (read one tensor at a time, each file's header checked
// when it is opened), and a writer of such shards that streams one tensor at a time.
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/checkpoint/safetensors.h"

namespace me::hf {

inline constexpr const char* kWeightsFile = "model.safetensors";
inline constexpr const char* kIndexFile = "model.safetensors.index.json";
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;  // transformers' "5GB"

// The weights of a Hugging Face model directory. me::Error naming the directory when it holds
// neither file (pytorch_model.bin is not read: it is a pickle).
class HfWeights {
 public:
  explicit HfWeights(const std::string& dir);
  ~HfWeights();

  const std::string& dir() const { return dir_; }
  // The file holding tensor `name` and its entry there; null when no file has it.
  const checkpoint::TensorEntry* find(const std::string& name, const checkpoint::SafetensorsFile** file = nullptr);
  // The tensor as LibTorch holds it, its own dtype (me::Error naming file and tensor when it
  // is missing).
  torch::Tensor read(const std::string& name);
  std::vector<std::string> names() const;  // every tensor of every file, sorted

 private:
  const checkpoint::SafetensorsFile& open(const std::string& file);

  std::string dir_;
  std::map<std::string, std::string> where_;  // tensor -> file
  std::map<std::string, std::unique_ptr<checkpoint::SafetensorsFile>> files_;
};

// A tensor to be written: where shards are planned, its size only.
struct PlannedTensor {
  std::string name;
  checkpoint::DType dtype = checkpoint::DType::F32;
  std::vector<int64_t> shape;
  uint64_t bytes() const;
};

// Tensors into files of at most `max_bytes` of data each, in order (a tensor larger than that
// gets a file of its own).
std::vector<std::vector<PlannedTensor>> plan_shards(const std::vector<PlannedTensor>& tensors, uint64_t max_bytes);

struct WrittenFile {
  std::string name;
  checkpoint::WriteResult result;
  std::vector<std::string> tensors;
};

// Writes planned shards into `dir` as `file_names[i]`, one tensor at a time, in plan order.
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::vector<std::vector<PlannedTensor>> plan, std::vector<std::string> file_names,
              std::map<std::string, std::string> metadata, bool fsync);
  ~ShardWriter();
  // The next tensor (its name, dtype and shape must be the plan's).
  void write(const std::string& name, const torch::Tensor& tensor);
  std::vector<WrittenFile> finish();

 private:
  std::string dir_;
  std::vector<std::vector<PlannedTensor>> plan_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
  bool fsync_;
  size_t file_ = 0, next_ = 0;
  std::unique_ptr<checkpoint::SafetensorsWriter> writer_;
  std::vector<WrittenFile> done_;
};

// transformers' names for shards: model.safetensors alone, or model-00001-of-00003.safetensors...
std::vector<std::string> hf_shard_names(size_t count);

}  // namespace me::hf
