#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for megaengine and builds it:
#   1. Debian packages (LibTorch 1.13 CPU, Lua 5.4, spdlog, Catch2, libedit, OpenBLAS, tmux, Slurm...)
#   2. third-party assets from npm at pinned versions, sha256-checked (scripts/fetch_assets.sh)
#   3. cmake + ninja build into build/ (BUILD_DIR to change)
# Idempotent: a second run installs nothing and rebuilds only what changed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$repo/build}
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo

packages=(build-essential cmake ninja-build pkg-config ca-certificates
  libtorch-dev libopenblas0-pthread   # Debian's libtorch; OpenBLAS replaces the reference BLAS (13x faster matmul)
  liblua5.4-dev libspdlog-dev libfmt-dev catch2 libedit-dev libgloo-dev
  libpcre2-dev nlohmann-json3-dev    # GPT-2 BPE: Unicode regex, encoder.json
  libsentencepiece-dev sentencepiece # SentencePiece tokenizer; spm_train/spm_encode for its tests
  clang-14 libfuzzer-14-dev            # scripts/fuzz.sh: libFuzzer targets (CI runs each FUZZ_SECONDS, 12 by default)
  tmux                                 # tmux drives the REPL test through a real terminal
  python3                              # scripts/long_functions.py (the style test)
  slurm-wlm munge                      # a real one-node Slurm for tests/cli/slurm_job.sh (slurm/*.sbatch)
  iproute2)                            # ip netns: the two-node cluster of tests/cluster/two_nodes.sh
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

bash "$repo/scripts/fetch_assets.sh"

cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "${JOBS:-2}"
echo "setup: built $build/megaengine"
