// The tensor side of hf_mapping.h's transforms, and where an export reads our tensors from.
#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/hf/convert.h"
#include "engine/core/error.h"

namespace me::hf {

namespace {

// {a, b, ...} followed by the trailing dimensions of `t` from `from` on.
std::vector<int64_t> sizes(std::vector<int64_t> lead, const torch::Tensor& t, int64_t from) {
  for (int64_t i = from; i < t.dim(); ++i) lead.push_back(t.size(i));
  return lead;
}

torch::Tensor t2(const torch::Tensor& x) { return x.dim() == 2 ? x.t() : x; }

}  // namespace

std::vector<torch::Tensor> to_hf(const TensorMap& m, const torch::Tensor& ours, const model::TransformerConfig& c) {
  const int64_t d = c.head_dim(), g = c.groups(), rep = c.heads / g;
  switch (m.transform) {
    case Transform::copy:
    case Transform::position: return {ours};
    case Transform::vocab_rows: return {ours.narrow(0, 0, c.vocab)};  // the padding is not a token
    case Transform::conv1d: return {t2(ours)};
    case Transform::qkv_grouped: {  // rows [groups, rep + 2, head_dim]: rep query heads, a key, a value
      const auto x = ours.view(sizes({g, rep + 2, d}, ours, 1));
      return {x.narrow(1, 0, rep).reshape(sizes({c.heads * d}, ours, 1)), x.select(1, rep).reshape(sizes({g * d}, ours, 1)),
              x.select(1, rep + 1).reshape(sizes({g * d}, ours, 1))};
    }
    case Transform::qkv_conv1d: {  // multi-head: [heads, 3, head_dim] -> [3, heads, head_dim]
      const auto x = ours.view(sizes({c.heads, 3, d}, ours, 1)).transpose(0, 1);
      return {t2(x.reshape(sizes({3 * c.heads * d}, ours, 1)))};
    }
    case Transform::gate_up: {  // rows [ffn, 2]: (gate, up) pairs
      const auto x = ours.view(sizes({ours.size(0) / 2, 2}, ours, 1));
      return {x.select(1, 0), x.select(1, 1)};
    }
  }
  fail("unknown transform");
}

torch::Tensor from_hf(const TensorMap& m, const std::vector<torch::Tensor>& hf, const model::TransformerConfig& c) {
  const int64_t d = c.head_dim(), g = c.groups(), rep = c.heads / g;
  const auto& a = hf.at(0);
  switch (m.transform) {
    case Transform::copy:
    case Transform::vocab_rows: return a;  // the model pads its own rows when it loads them
    case Transform::position: return a.narrow(0, 0, c.seq);  // n_positions may exceed model.seq
    case Transform::conv1d: return t2(a);
    case Transform::qkv_grouped: {
      const auto q = a.reshape(sizes({g, rep, d}, a, 1)), k = hf.at(1).reshape(sizes({g, 1, d}, a, 1)),
                 v = hf.at(2).reshape(sizes({g, 1, d}, a, 1));
      return torch::cat({q, k, v}, 1).reshape(sizes({(c.heads + 2 * g) * d}, a, 1));
    }
    case Transform::qkv_conv1d: {
      const auto x = t2(a);
      return x.reshape(sizes({3, c.heads, d}, x, 1)).transpose(0, 1).reshape(sizes({3 * c.heads * d}, x, 1));
    }
    case Transform::gate_up:
      return torch::stack({a, hf.at(1)}, 1).reshape(sizes({2 * a.size(0)}, a, 1));
  }
  fail("unknown transform");
}

namespace {

class CheckpointSource : public WeightSource {
 public:
  explicit CheckpointSource(const std::string& path)
      : reader_(checkpoint::resolve_iteration_dir(path)),
        spec_(checkpoint::recipe_from_json(reader_.metadata().recipe_json, files_path(reader_.path()))) {
    const auto it = reader_.metadata().tensors.find("model.embedding.weight");
    ME_CHECK(it != reader_.metadata().tensors.end(), "checkpoint '", reader_.path(),
             "' has no model.embedding.weight: it holds no model weights to export");
    model_dtype_ = checkpoint::scalar_type_of(*checkpoint::parse_dtype(it->second.dtype));
  }
  std::string describe() const override { return "checkpoint '" + reader_.path() + "'"; }
  const config::Recipe& spec() const override { return spec_; }
  torch::ScalarType model_dtype() const override { return model_dtype_; }

  torch::Tensor load(const std::string& name, torch::ScalarType dtype) override {
    const std::string master = "master." + name, model = "model." + name;
    const std::string& source = dtype == torch::kFloat && reader_.has(master) ? master : model;
    ME_CHECK(reader_.has(source), "checkpoint '", reader_.path(), "' has no tensor '", model,
             "', which the exported model needs: it is not a checkpoint of the model its recipe describes");
    const auto& record = reader_.metadata().tensors.at(source);
    checkpoint::StateTensor t;
    t.name = source;
    t.global_shape = record.shape;
    t.tensor = torch::empty(record.shape, checkpoint::scalar_type_of(*checkpoint::parse_dtype(record.dtype)));
    t.flat_length = t.tensor.numel();
    reader_.load(t);
    return t.tensor.to(dtype);
  }

 private:
  static std::string files_path(const std::string& dir) { return dir + "/" + checkpoint::kMetadataFile; }
  checkpoint::CheckpointReader reader_;
  config::Recipe spec_;
  torch::ScalarType model_dtype_ = torch::kFloat;
};

}  // namespace

std::unique_ptr<WeightSource> checkpoint_source(const std::string& path) {
  return std::make_unique<CheckpointSource>(path);
}

}  // namespace me::hf
