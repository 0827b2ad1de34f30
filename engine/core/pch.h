// Precompiled header for every target that uses LibTorch: parsing torch/torch.h costs
// ~20 s per file on the 2-core machines, once here instead.
#pragma once
#include <torch/torch.h>
