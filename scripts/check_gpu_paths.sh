#!/usr/bin/env bash
# The GPU-only code paths (#if ME_TORCH_HAS_CUDA, ME_HAVE_CUDA_KERNELS, ME_PEER_COLLECTIVES,
# ME_HAVE_NCCL) compiled for syntax on this CPU machine: Debian's LibTorch 1.13 ships the c10/cuda
# and ATen/cuda headers, and the CUDA toolkit's are in /usr/local/cuda. A GPU path that no longer
# compiles shows here, not in a device call's build (which costs the call). Not a substitute for
# the GPU build: LibTorch 2.11's API there differs in places (engine/core/torch_compat.h).
#   bash scripts/check_gpu_paths.sh [FILE...]   (default: every engine/ and bindings/ .cpp naming those macros)
# About 15 s of CPU a file, two at a time (ME_JOBS: how many).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
if [ ! -f /usr/local/cuda/include/cuda_runtime.h ] || [ ! -f /usr/include/ATen/cuda/CUDAContext.h ]; then
  echo "no CUDA toolkit headers in /usr/local/cuda or no LibTorch CUDA headers in /usr/include: skipped"
  exit 77
fi
files=("$@")
# (engine/comm/nccl_group.cpp is left out: the build compiles it with NCCL, me_nccl_compile_check.)
[ ${#files[@]} -gt 0 ] ||
  mapfile -t files < <(grep -rlE "ME_TORCH_HAS_CUDA|ME_HAVE_CUDA_KERNELS|ME_PEER_COLLECTIVES|ME_HAVE_NCCL" \
    --include='*.cpp' engine bindings | grep -v '^engine/comm/nccl_group.cpp$' | sort)
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
# What a GPU build's CMake generates: the build's features, and the c10/cuda config header that
# Debian's CPU LibTorch lacks.
mkdir -p "$gen/engine/core" "$gen/c10/cuda/impl"
printf '#pragma once\n#define ME_HAVE_TOKENIZERS 1\n#define ME_HAVE_CUDA_KERNELS 1\n' > "$gen/engine/core/build_config.h"
echo '#define C10_CUDA_BUILD_SHARED_LIBS' > "$gen/c10/cuda/impl/cuda_cmake_macros.h"
export gen repo
check() {
  local out
  if out=$(c++ -std=gnu++17 -fsyntax-only -D_GLIBCXX_USE_CXX11_ABI=1 -DME_TORCH_HAS_CUDA=1 -DME_HAVE_NCCL=1 \
    -DME_HAVE_GLOO=1 -DUSE_C10D_GLOO -DUSE_DISTRIBUTED -DME_VERSION='"gpu-path-check"' -I"$gen" -I"$repo" \
    -isystem /usr/include/torch/csrc/api/include -isystem /usr/local/cuda/include -isystem /usr/include/lua5.4 \
    "$1" 2>&1); then
    echo "ok      $1"
  else
    echo "FAILED  $1"
    echo "$out" | grep -E "error" | head -10
    return 1
  fi
}
export -f check
printf '%s\n' "${files[@]}" | xargs -P "${ME_JOBS:-2}" -I{} bash -c 'check {}'
status=$?
[ $status -eq 0 ] && echo "the GPU paths of ${#files[@]} files compile (syntax, LibTorch $(grep -o '"[0-9.]*' /usr/include/torch/csrc/api/include/torch/version.h 2>/dev/null | head -1 | tr -d '"') headers)"
exit $status
