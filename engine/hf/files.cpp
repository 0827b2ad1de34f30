#include "engine/hf/files.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/checkpoint/state.h"
#include "engine/core/error.h"
#include "engine/core/files.h"

namespace me::hf {

namespace {

// model.safetensors.index.json: {"metadata": {...}, "weight_map": {"tensor": "file", ...}}
std::map<std::string, std::string> read_index(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(checkpoint::read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail("'", path, "' is not JSON (", e.what(), ")");
  }
  ME_CHECK(j.is_object() && j.contains("weight_map") && j.at("weight_map").is_object(), "'", path,
           "' has no weight_map object (tensor name -> shard file)");
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : j.at("weight_map").items()) {
    ME_CHECK(file.is_string(), "'", path, "': weight_map[\"", name, "\"] is not a file name");
    const auto f = file.get<std::string>();
    // Shards live in the model's directory: a path elsewhere is not a model's index.
    ME_CHECK(checkpoint::is_plain_file_name(f), "'", path,
             "': weight_map[\"", name, "\"] names '", f, "', not a file in the model's directory");
    out[name] = f;
  }
  return out;
}

}  // namespace

HfWeights::HfWeights(const std::string& dir) : dir_(dir) {
  ME_CHECK(files::is_directory(dir), "Hugging Face model '", dir, "' does not exist or is not a directory");
  const auto index = files::join(dir, kIndexFile), single = files::join(dir, kWeightsFile);
  if (files::exists(index)) {
    where_ = read_index(index);
    return;
  }
  ME_CHECK(files::exists(single), "'", dir, "' holds neither ", kWeightsFile, " nor ", kIndexFile,
           files::exists(files::join(dir, "pytorch_model.bin"))
               ? " (only pytorch_model.bin, a pickle, which megaengine does not read: save the model again with "
                 "save_pretrained(dir, safe_serialization=True))"
               : ": it is not a Hugging Face model directory");
  for (const auto& e : open(kWeightsFile).tensors()) where_[e.name] = kWeightsFile;
}

HfWeights::~HfWeights() = default;

const checkpoint::SafetensorsFile& HfWeights::open(const std::string& file) {
  auto& slot = files_[file];
  if (!slot) {
    const auto path = files::join(dir_, file);
    ME_CHECK(files::exists(path), "'", path, "' is missing (the index lists it)");
    slot = std::make_unique<checkpoint::SafetensorsFile>(path);
  }
  return *slot;
}

const checkpoint::TensorEntry* HfWeights::find(const std::string& name, const checkpoint::SafetensorsFile** file) {
  const auto it = where_.find(name);
  if (it == where_.end()) return nullptr;
  const auto& f = open(it->second);
  const auto* e = f.find(name);
  ME_CHECK(e, "'", f.path(), "' has no tensor '", name, "', which ", kIndexFile, " places there");
  if (file) *file = &f;
  return e;
}

torch::Tensor HfWeights::read(const std::string& name) {
  const checkpoint::SafetensorsFile* file = nullptr;
  const auto* e = find(name, &file);
  ME_CHECK(e, "the Hugging Face model '", dir_, "' has no tensor '", name, "'");
  auto out = torch::empty(e->shape, checkpoint::scalar_type_of(e->dtype));
  file->read(*e, out.data_ptr());
  return out;
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

uint64_t PlannedTensor::bytes() const {
  uint64_t n = checkpoint::dtype_size(dtype);
  for (const int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::vector<std::vector<PlannedTensor>> plan_shards(const std::vector<PlannedTensor>& tensors, uint64_t max_bytes) {
  std::vector<std::vector<PlannedTensor>> out;
  uint64_t filled = 0;
  for (const auto& t : tensors) {
    if (out.empty() || (filled > 0 && filled + t.bytes() > max_bytes)) {
      out.emplace_back();
      filled = 0;
    }
    out.back().push_back(t);
    filled += t.bytes();
  }
  return out;
}

std::vector<std::string> hf_shard_names(size_t count) {
  if (count <= 1) return {kWeightsFile};
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, count);
    out.push_back(name);
  }
  return out;
}

ShardWriter::ShardWriter(std::string dir, std::vector<std::vector<PlannedTensor>> plan,
                         std::vector<std::string> file_names, std::map<std::string, std::string> metadata, bool fsync)
    : dir_(std::move(dir)), plan_(std::move(plan)), names_(std::move(file_names)), metadata_(std::move(metadata)),
      fsync_(fsync) {
  ME_CHECK(names_.size() == plan_.size(), "ShardWriter: ", plan_.size(), " shards planned, ", names_.size(), " names");
}

ShardWriter::~ShardWriter() = default;

void ShardWriter::write(const std::string& name, const torch::Tensor& tensor) {
  if (writer_ && next_ == plan_[file_].size()) {  // this file is full: close it, open the next
    done_.back().result = writer_->finish();
    writer_.reset();
    ++file_;
    next_ = 0;
  }
  ME_CHECK(file_ < plan_.size() && next_ < plan_[file_].size(), "ShardWriter: tensor '", name, "' was not planned");
  const auto& p = plan_[file_][next_];
  if (!writer_) {
    std::vector<checkpoint::TensorSource> specs;
    for (const auto& t : plan_[file_]) specs.push_back({t.name, t.dtype, t.shape, nullptr});
    checkpoint::WriteOptions o;
    o.fsync = fsync_;
    writer_ = std::make_unique<checkpoint::SafetensorsWriter>(files::join(dir_, names_[file_]), specs, metadata_, o);
    done_.push_back({names_[file_], {}, {}});
  }
  const auto host = tensor.detach().to(torch::kCPU).contiguous();
  ME_CHECK(p.name == name && checkpoint::dtype_of(host.scalar_type()) == p.dtype && host.sizes().vec() == p.shape,
           "ShardWriter: tensor '", name, "' is ", checkpoint::dtype_name(checkpoint::dtype_of(host.scalar_type())), " ",
           checkpoint::shape_text(host.sizes().vec()), ", the plan has '", p.name, "' ", checkpoint::dtype_name(p.dtype), " ",
           checkpoint::shape_text(p.shape));
  writer_->append(name, host.data_ptr(), p.bytes());
  done_.back().tensors.push_back(name);
  ++next_;
}

std::vector<WrittenFile> ShardWriter::finish() {
  ME_CHECK(file_ + 1 >= plan_.size() && (plan_.empty() || next_ == plan_.back().size()),
           "ShardWriter: finished before every planned tensor was written");
  if (writer_) done_.back().result = writer_->finish();
  writer_.reset();
  return done_;
}

}  // namespace me::hf
