// Non-tensor state that an autograd function's backward needs (a process group, a linear
// layer's LinearComm, the function to recompute), kept in the context's saved_data. IValue has
// no slot for a C++ object, but it holds a capsule of one: the value travels typed, and reading
// it back checks the type, instead of pointers passed as integers and cast back by hand.
#pragma once
#include <torch/torch.h>

#include <utility>

#include "engine/core/error.h"

namespace me {

template <class T>
struct AutogradState : torch::CustomClassHolder {
  explicit AutogradState(T v) : value(std::move(v)) {}
  T value;
};

template <class T>
void save_state(torch::autograd::AutogradContext* ctx, const char* key, T value) {
  ctx->saved_data[key] = c10::IValue::make_capsule(c10::make_intrusive<AutogradState<T>>(std::move(value)));
}

// The value saved under `key` (the context's saved_data keeps it alive).
template <class T>
const T& saved_state(torch::autograd::AutogradContext* ctx, const char* key) {
  const auto holder = ctx->saved_data.at(key).toCapsule();
  const auto* state = dynamic_cast<const AutogradState<T>*>(holder.get());
  ME_CHECK(state, "autograd state '", key, "' was saved with another type");
  return state->value;
}

}  // namespace me
