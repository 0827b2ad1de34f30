#include "engine/checkpoint/state.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <tuple>

#include "engine/checkpoint/checkpoint_dir.h"
#include "engine/core/error.h"
#include "engine/core/files.h"
#include "engine/core/torch_compat.h"

namespace me::checkpoint {

namespace {

constexpr std::pair<DType, torch::ScalarType> kTypes[] = {
    {DType::F64, torch::kDouble}, {DType::F32, torch::kFloat}, {DType::F16, torch::kHalf},
    {DType::BF16, torch::kBFloat16}, {DType::I64, torch::kLong}, {DType::I32, torch::kInt},
    {DType::I16, torch::kShort}, {DType::I8, torch::kChar}, {DType::U8, torch::kByte}, {DType::BOOL, torch::kBool}};

std::vector<int64_t> slice_shape(std::vector<int64_t> shape, int64_t dim, int64_t length) {
  if (dim >= 0) shape[static_cast<size_t>(dim)] = length;
  return shape;
}

}  // namespace

DType dtype_of(torch::ScalarType t) {
  for (const auto& [d, s] : kTypes)
    if (s == t) return d;
  fail("checkpoint: tensors of dtype ", c10::toString(t), " cannot be saved");
}

torch::ScalarType scalar_type_of(DType d) {
  for (const auto& [k, s] : kTypes)
    if (k == d) return s;
  fail("checkpoint: unknown dtype");
}

Metadata describe_pieces(const std::vector<StateTensor>& tensors, const std::string& file) {
  Metadata m;
  for (const auto& t : tensors) {
    if (!t.save) continue;
    auto& r = m.tensors[t.name];
    r.dtype = dtype_name(dtype_of(t.tensor.scalar_type()));
    r.shape = t.global_shape;
    r.pieces.push_back({file, t.name, t.dim, t.start, t.length, t.flat_start, t.flat_length});
  }
  return m;
}

torch::Tensor& HostSnapshot::buffer(size_t k, const std::string& name, const torch::Tensor& like) {
  if (k == names_.size()) {
    names_.push_back(name);
    host_.emplace_back();
  }
  auto& host = host_[k];
  if (names_[k] != name || !host.defined() || host.sizes() != like.sizes() || host.scalar_type() != like.scalar_type()) {
    names_[k] = name;
    host = torch::empty(like.sizes(), torch::TensorOptions(like.scalar_type()).pinned_memory(like.is_cuda()));
  }
  return host;
}

void HostSnapshot::prepare(const std::vector<StateTensor>& tensors) {
  size_t k = 0;
  for (const auto& t : tensors)
    if (t.save) buffer(k++, t.name, t.tensor);
}

int64_t HostSnapshot::take(const std::vector<StateTensor>& tensors) {
  torch::NoGradGuard no_grad;
  size_t k = 0;
  int64_t bytes = 0;
  bool cuda = false;
  for (const auto& t : tensors) {
    if (!t.save) continue;
    const auto src = t.tensor.detach();
    auto& host = buffer(k++, t.name, src);
    host.copy_(src, /*non_blocking=*/src.is_cuda());
    cuda = cuda || src.is_cuda();
    bytes += static_cast<int64_t>(host.nbytes());
  }
  names_.resize(k);
  host_.resize(k);
  if (cuda) compat::cuda_synchronize();
  return bytes;
}

WriteResult HostSnapshot::write(const std::string& path, const WriteOptions& options) const {
  std::vector<TensorSource> sources;
  for (size_t i = 0; i < host_.size(); ++i)
    sources.push_back({names_[i], dtype_of(host_[i].scalar_type()), host_[i].sizes().vec(), host_[i].data_ptr()});
  return write_safetensors(path, sources, {{"format", "megaengine-checkpoint-shard"}}, options);
}

namespace {
// How to go on without a damaged iteration: the earlier ones its checkpoint directory holds.
std::string earlier_hint(std::string iteration_dir) {
  while (iteration_dir.size() > 1 && iteration_dir.back() == '/') iteration_dir.pop_back();
  const CheckpointDir dir(files::parent(iteration_dir));
  const std::string mine = iteration_dir.substr(iteration_dir.rfind('/') + 1);
  std::vector<int64_t> earlier;
  for (const int64_t it : dir.committed()) {
    const std::string path = dir.iteration_path(it);
    if (path.substr(path.rfind('/') + 1) < mine) earlier.push_back(it);  // iter_%07d names sort as numbers
  }
  if (earlier.empty()) return cat("restore it (", dir.path(), " holds no earlier iteration)");
  return cat("restore it, or load an earlier checkpoint: checkpoint.iteration=", earlier.back(), " (", dir.path(),
             " holds iterations ", iteration_list(dir.committed()), ")");
}
}  // namespace

CheckpointReader::CheckpointReader(const std::string& iteration_dir) : dir_(iteration_dir) {
  const auto file = files::join(dir_, kMetadataFile);
  ME_CHECK(files::exists(file), "checkpoint '", dir_, "' has no ", kMetadataFile,
           ": it was not committed (a save interrupted before its end?)");
  meta_ = Metadata::parse(read_file(file), file);
}

CheckpointReader::~CheckpointReader() = default;

const SafetensorsFile& CheckpointReader::shard(const std::string& file) {
  auto& slot = shards_[file];
  if (slot) return *slot;
  const auto it = meta_.shards.find(file);
  ME_CHECK(it != meta_.shards.end(), "checkpoint '", dir_, "': shard '", file, "' is not in its metadata");
  const auto path = files::join(dir_, file);
  const int64_t size = files::file_size(path);
  ME_CHECK(size >= 0, "checkpoint '", dir_, "': shard '", file, "' (rank ", it->second.rank, ") is missing: ",
           std::strerror(errno));
  ME_CHECK(static_cast<uint64_t>(size) == it->second.bytes, "checkpoint shard '", path, "' is ", size, " bytes but was written with ",
           it->second.bytes, " (truncated or replaced): ", earlier_hint(dir_));
  auto opened = std::make_unique<SafetensorsFile>(path);
  const uint32_t crc = opened->crc32c();
  char got[9], want[9];
  std::snprintf(got, sizeof got, "%08x", crc);
  std::snprintf(want, sizeof want, "%08x", it->second.crc32c);
  ME_CHECK(crc == it->second.crc32c, "checkpoint shard '", path, "' fails its checksum (CRC-32C ", got,
           ", written as ", want, "): the file is corrupt; ", earlier_hint(dir_));
  slot = std::move(opened);
  return *slot;
}

void CheckpointReader::verify_all() {
  for (const auto& [file, record] : meta_.shards) shard(file);
}

torch::Tensor CheckpointReader::read_slice(const std::string& name, const TensorRecord& record, const Piece& slice) {
  const auto dtype = parse_dtype(record.dtype);
  ME_CHECK(dtype, "checkpoint '", dir_, "': tensor '", name, "' has dtype '", record.dtype, "', which cannot be read");
  auto out = torch::empty(slice_shape(record.shape, slice.dim, slice.length), scalar_type_of(*dtype));
  auto flat = out.view({-1});
  std::vector<const Piece*> parts;
  for (const auto& p : record.pieces)
    if (p.dim == slice.dim && p.start == slice.start && p.length == slice.length) parts.push_back(&p);
  std::sort(parts.begin(), parts.end(), [](const Piece* a, const Piece* b) { return a->flat_start < b->flat_start; });
  int64_t covered = 0;
  for (const auto* p : parts) {
    ME_CHECK(p->flat_start == covered && p->flat_length >= 0 && covered + p->flat_length <= flat.numel(), "checkpoint '",
             dir_, "': the pieces of tensor '", name, "' do not tile it (elements ", covered, " onward)");
    const auto& file = shard(p->file);
    const auto& e = file.at(p->key);
    ME_CHECK(e.dtype == *dtype && e.numel() == p->flat_length, "checkpoint shard '", file.path(), "': tensor '", p->key,
             "' is ", dtype_name(e.dtype), " x ", e.numel(), ", the metadata says ", record.dtype, " x ", p->flat_length);
    file.read(e, flat.narrow(0, p->flat_start, p->flat_length).data_ptr());
    covered += p->flat_length;
  }
  ME_CHECK(covered == flat.numel(), "checkpoint '", dir_, "': tensor '", name, "' is missing elements ", covered, "..",
           flat.numel(), " of a slice (a shard not written?)");
  return out;
}

void CheckpointReader::load(const StateTensor& target, const std::string& source) {
  torch::NoGradGuard no_grad;
  const std::string& name = source.empty() ? target.name : source;
  const auto it = meta_.tensors.find(name);
  ME_CHECK(it != meta_.tensors.end(), "checkpoint '", dir_, "' has no tensor '", name,
           "': it was saved from another model or optimizer (see megaengine checkpoint inspect)");
  const auto& rec = it->second;
  const auto& want = target.global_shape;
  bool same = rec.shape.size() == want.size();
  for (size_t i = 0; same && i < want.size(); ++i) same = rec.shape[i] == want[i] || (i == 0 && target.padded_vocab);
  ME_CHECK(same, "checkpoint '", dir_, "': tensor '", name, "' is ", shape_text(rec.shape), " there but ",
           shape_text(want), " in this model: the checkpoint is of another model (compare the recipes' model fields)");
  // Rows both vocabulary paddings have (the real vocabulary and some padding).
  const int64_t rows = target.padded_vocab ? std::min(rec.shape[0], want[0]) : -1;
  const auto shape = slice_shape(want, target.dim, target.length);
  int64_t slice_numel = 1;
  for (const int64_t d : shape) slice_numel *= d;
  // A whole slice (a parameter), or part of one (the distributed optimizer's share of it).
  const bool whole = target.flat_start == 0 && target.flat_length == slice_numel;
  // The target's slice of the global tensor, in the checkpoint's dtype; starts as the target's
  // own values where the target is a whole slice (rows only one padding has keep them).
  const auto ckpt_type = target.tensor.scalar_type() == torch::kBFloat16 || target.tensor.scalar_type() == torch::kHalf
                             ? scalar_type_of(*parse_dtype(rec.dtype))
                             : target.tensor.scalar_type();
  auto local = whole ? target.tensor.detach().to(torch::kCPU, ckpt_type, false, true).view(shape)
                     : torch::zeros(shape, ckpt_type);
  std::vector<std::tuple<int64_t, int64_t, int64_t>> done;
  for (const auto& p : rec.pieces) {
    const auto key = std::make_tuple(p.dim, p.start, p.length);
    if (std::find(done.begin(), done.end(), key) != done.end()) continue;
    done.push_back(key);
    const int64_t axis = target.dim >= 0 ? target.dim : p.dim;  // the split axis (-1: neither is split)
    ME_CHECK(target.dim < 0 || p.dim < 0 || p.dim == target.dim, "checkpoint '", dir_, "': tensor '", name,
             "' is split along dim ", p.dim, " there, along ", target.dim, " here");
    const int64_t t0 = target.dim >= 0 ? target.start : 0, s0 = p.dim >= 0 ? p.start : 0;
    int64_t lo = 0, hi = 0;
    if (axis >= 0) {
      lo = std::max(t0, s0);
      hi = std::min(target.dim >= 0 ? t0 + target.length : want[static_cast<size_t>(axis)],
                    p.dim >= 0 ? s0 + p.length : rec.shape[static_cast<size_t>(axis)]);
      if (rows >= 0 && axis == 0) hi = std::min(hi, rows);
      if (hi <= lo) continue;
    }
    auto src = read_slice(name, rec, p).to(ckpt_type);
    auto dst = local;
    if (axis >= 0) {
      src = src.narrow(axis, lo - s0, hi - lo);
      dst = dst.narrow(axis, lo - t0, hi - lo);
    }
    if (rows >= 0 && axis != 0) {
      src = src.narrow(0, 0, rows);
      dst = dst.narrow(0, 0, rows);
    }
    dst.copy_(src);
  }
  auto flat = local.view({-1});
  auto value = whole ? local : flat.narrow(0, target.flat_start, target.flat_length);
  target.tensor.detach().copy_(value.view(target.tensor.sizes()));
}

}  // namespace me::checkpoint
