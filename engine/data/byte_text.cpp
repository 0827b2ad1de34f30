#include "engine/data/byte_text.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "engine/core/error.h"
#include "engine/core/utf8.h"

namespace me::data {

ByteTextDataset::ByteTextDataset(const std::string& path, double holdout, int64_t seq) : seq_(seq) {
  ME_CHECK(holdout > 0 && holdout < 1, "data.holdout must be in (0, 1), got ", holdout);
  std::error_code ec;
  // A directory opens as a stream on Linux and fails only when read ("basic_filebuf::underflow").
  ME_CHECK(!std::filesystem::is_directory(path, ec), "data file '", path,
           "' is a directory: data.path names one text file (e.g. data.path = \"corpus.txt\")");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open data file '", path, "': ", std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto n = static_cast<int64_t>(bytes.size());
  const auto n_valid = static_cast<int64_t>(static_cast<double>(n) * holdout);
  ME_CHECK(n - n_valid > seq + 1 && n_valid > seq + 1, "data file '", path, "' holds ", n,
           " bytes: too few for model.seq = ", seq, " with holdout ", holdout);
  auto all = torch::from_blob(bytes.data(), {n}, torch::kUInt8).to(torch::kLong);
  train_ = all.narrow(0, 0, n - n_valid).clone();
  valid_ = all.narrow(0, n - n_valid, n_valid).clone();
}

Batch ByteTextDataset::sample(bool validation, int64_t batch, std::mt19937_64& rng) const {
  const auto& src = validation ? valid_ : train_;
  std::uniform_int_distribution<int64_t> offset(0, src.numel() - seq_ - 1);
  std::vector<torch::Tensor> rows;
  rows.reserve(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) rows.push_back(src.narrow(0, offset(rng), seq_ + 1));
  auto windows = torch::stack(rows);
  return {windows.narrow(1, 0, seq_).contiguous(), windows.narrow(1, 1, seq_).contiguous()};
}

std::vector<int64_t> ByteTextDataset::encode(const std::string& text) {
  std::vector<int64_t> out;
  for (unsigned char c : text) out.push_back(c);
  return out;
}

std::string ByteTextDataset::decode(const std::vector<int64_t>& tokens) {
  std::string out;
  for (auto t : tokens) out.push_back(static_cast<char>(t & 0xff));
  return utf8::repair(out);
}

}  // namespace me::data
