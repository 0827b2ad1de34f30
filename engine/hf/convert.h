// Hugging Face interoperability: a checkpoint (any layout) or a trainer exported as a
// transformers model directory (config.json, model.safetensors or <= 5 GB shards with their
// index, generation_config.json, the tokenizer's files), and a transformers directory imported
// as a checkpoint of weights alone (iteration 0; the trainer starts a fresh optimizer from it
// and reshards it to its own layout). Both stream one tensor (one layer's q/k/v) at a time.
// The mapping itself is hf_mapping.h's tables.
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/hf/files.h"
#include "engine/hf/mapping.h"
#include "engine/checkpoint/state.h"
#include "engine/config/recipe.h"

namespace me::hf {

// One table row's tensors: ours (whole; a padded vocabulary allowed) -> Hugging Face's, and back.
// `c` is the model's config.
std::vector<torch::Tensor> to_hf(const TensorMap& m, const torch::Tensor& ours, const model::TransformerConfig& c);
torch::Tensor from_hf(const TensorMap& m, const std::vector<torch::Tensor>& hf, const model::TransformerConfig& c);

// Where an export reads our whole tensors (a checkpoint of any layout; an interface so that a
// trainer's memory can be one too).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual std::string describe() const = 0;
  virtual const config::Recipe& spec() const = 0;
  virtual torch::ScalarType model_dtype() const = 0;  // the model's weights'
  // Our tensor `name` ("blocks.0.attn.qkv.weight") whole in `dtype`; fp32 from the fp32 master
  // copy where a bf16 or fp16 run has one. me::Error naming it when absent.
  virtual torch::Tensor load(const std::string& name, torch::ScalarType dtype) = 0;
};
std::unique_ptr<WeightSource> checkpoint_source(const std::string& path);

struct ExportOptions {
  std::string dtype;  // fp32 | bf16 | fp16; "": the model's own
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  bool overwrite = false;  // replace an existing output directory, when it is an earlier export
  std::string source;      // the checkpoint exported, which the output must not replace ("": none)
};

struct ExportResult {
  std::string dir, family, dtype;          // dtype as config.json names it ("bfloat16")
  std::vector<std::string> files;          // every file written, by name
  uint64_t weight_bytes = 0;
  int64_t tensors = 0;
  std::vector<std::string> notes;          // what was not written and why (tokenizer files)
};

// Writes the model directory into `out_dir` (a temporary sibling renamed at the end: a failed
// export leaves nothing). me::Error naming the tensor or file for what cannot be exported.
ExportResult export_hf(WeightSource& source, const std::string& out_dir, const ExportOptions& options = {});
// CHECKPOINT: a checkpoint directory (its latest iteration) or an iter_N directory.
ExportResult export_hf(const std::string& checkpoint, const std::string& out_dir, const ExportOptions& options = {});

struct ImportOptions {
  const model::TransformerConfig* expected = nullptr;  // the recipe's model: any difference is an error
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;     // our checkpoint's shard files
  std::string name;                                     // the run name recorded in the checkpoint
};

struct ImportResult {
  std::string iteration_dir;
  model::TransformerConfig config;
  int64_t tensors = 0;
  uint64_t bytes = 0;
  std::vector<std::string> unused;  // Hugging Face tensors the model has no place for
};

// Converts the model directory `hf_dir` into the checkpoint directory `checkpoint_dir`
// (iteration 0, weights only; it must hold no checkpoint yet). me::Error naming the file and
// tensor for a missing tensor, a wrong shape or dtype, a damaged file, a config that does not
// match `expected`.
ImportResult import_hf(const std::string& hf_dir, const std::string& checkpoint_dir, const ImportOptions& options = {});
// The same checked against the recipe's model; returns the iteration directory to load.
std::string import_hf(const std::string& hf_dir, const model::TransformerConfig& expected, const std::string& out_dir);

// checkpoint.load = "hf:DIR" for a run: every rank checks config.json against the recipe; rank 0
// converts once into <checkpoint_dir>/hf_import-<hash of the source>/ (reused when there) while
// the others wait in `barrier`; one process without checkpoint.dir converts into a temporary
// directory $TMPDIR/megaengine-hf-<pid>-*, removed once loaded (release_temp_conversion) or at
// exit, and by the next conversion when its process died first. Several ranks need
// checkpoint.dir (a shared directory). Returns the iteration directory every rank loads.
// Removes the temporary conversion holding `iteration_dir`, once it is loaded; nothing when
// `iteration_dir` is not one.
void release_temp_conversion(const std::string& iteration_dir);
std::string import_hf_for_run(const std::string& hf_dir, const model::TransformerConfig& expected,
                              const std::string& checkpoint_dir, int rank, int world,
                              const std::function<void()>& barrier);

}  // namespace me::hf
