#include "engine/parallel/symmetric_slots.h"

#include <mutex>
#include <vector>

#include "engine/core/error.h"

namespace me::parallel {

struct SymmetricSlots::State {
  Allocate allocate;
  int64_t max_bytes = 0, slot_bytes = 0, fallbacks = 0;
  std::vector<torch::Tensor> windows;  // each holds kSlotsPerWindow slots
  std::vector<char*> slots;            // slot i's first byte
  std::vector<int> free;               // a stack: the same order of takes and gives on every rank
  std::mutex mutex;                    // autograd may free saved tensors on its device thread
};

namespace {
constexpr int kSlotsPerWindow = 8;  // fewer, larger registrations
constexpr int64_t kAlign = int64_t{1} << 16;  // slot offsets, so every slot starts 64 KiB-aligned
}  // namespace

SymmetricSlots::SymmetricSlots(Allocate allocate, int64_t max_bytes) : state_(std::make_shared<State>()) {
  ME_CHECK(max_bytes >= 0, "symmetric slots: the byte limit must be >= 0, got ", max_bytes);
  state_->allocate = std::move(allocate);
  state_->max_bytes = max_bytes;
}

torch::Tensor SymmetricSlots::take(at::IntArrayRef sizes, const torch::TensorOptions& options) {
  auto& s = *state_;
  int64_t numel = 1;
  for (const auto d : sizes) numel *= d;
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(c10::typeMetaToScalarType(options.dtype())));
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.slot_bytes == 0) s.slot_bytes = std::max<int64_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  const int64_t window_bytes = s.slot_bytes * kSlotsPerWindow;
  if (bytes > s.slot_bytes ||
      (s.free.empty() && static_cast<int64_t>(s.windows.size() + 1) * window_bytes > s.max_bytes)) {
    ++s.fallbacks;
    return {};
  }
  if (s.free.empty()) {
    auto window = s.allocate(window_bytes);
    ME_CHECK(window.numel() == window_bytes && window.is_contiguous(), "symmetric slots: the allocator returned ",
             window.numel(), " bytes for ", window_bytes);
    for (int k = kSlotsPerWindow; k-- > 0;) {
      s.free.push_back(static_cast<int>(s.slots.size()) + k);
    }
    for (int k = 0; k < kSlotsPerWindow; ++k) s.slots.push_back(static_cast<char*>(window.data_ptr()) + k * s.slot_bytes);
    s.windows.push_back(window);
  }
  const int slot = s.free.back();
  s.free.pop_back();
  std::weak_ptr<State> weak = state_;
  auto give_back = [weak, slot](void*) {
    if (auto st = weak.lock()) {
      std::lock_guard<std::mutex> l(st->mutex);
      st->free.push_back(slot);
    }
  };
  return torch::from_blob(s.slots[static_cast<size_t>(slot)], sizes, give_back,
                          options.device(s.windows.front().device()));
}

int64_t SymmetricSlots::registered_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return static_cast<int64_t>(state_->windows.size()) * state_->slot_bytes * kSlotsPerWindow;
}

int64_t SymmetricSlots::fallbacks() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->fallbacks;
}

}  // namespace me::parallel
