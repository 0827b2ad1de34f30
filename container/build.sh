#!/usr/bin/env bash
# Builds, tests and installs megaengine with nothing left out: LibTorch with CUDA (the torch 2.11
# cu130 wheel), NCCL, the CUDA kernels, the GPT-2 and SentencePiece tokenizers, the REPL's libedit.
# Made for Ubuntu 24.04 + CUDA 13 and runs in two places:
#   - as root in container/Dockerfile, with network: installs what is missing (apt, the torch
#     wheel, Catch2 2, the assets) and, with ME_WITH_EFA=1, libfabric + aws-ofi-nccl for EFA;
#   - on the GPU machine, without network: uses what is installed plus Debian .debs staged with
#     ../shared/gpu/stage-debs.sh (unpacked into ME_DEPS_PREFIX, never apt). Nothing is fetched.
#
#   container/build.sh [STEP...]    STEP: deps efa build test install, or all (the default:
#                                   deps build test install; efa too when ME_WITH_EFA=1)
# Environment (defaults in brackets):
#   ME_DEBS [.debs if it exists]   staged .deb files; using them implies ME_OFFLINE=1
#   ME_OFFLINE [0]                 1: install nothing, fail with the list of what is missing
#   ME_DEPS_PREFIX [/opt/deps]     where staged or downloaded .debs are unpacked
#   ME_BUILD_DIR [build-release]   ME_PREFIX [/opt/megaengine]: install prefix (bin/)
#   ME_TORCH_VENV [/opt/torch]     venv for the torch wheel when no python3 imports torch
#   ME_TORCH_VERSION [2.11.0]      ME_TORCH_INDEX [https://download.pytorch.org/whl/cu130]
#   ME_CUDA_ARCH [90]              ME_WITH_EFA [0]   JOBS [nproc]
#   ME_TEST_ARGS                   extra ctest arguments, e.g. "-R tokenizer"
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
say() { echo "build.sh: $*"; }
die() { echo "build.sh: error: $*" >&2; exit 1; }

debs=${ME_DEBS:-}
[ -z "$debs" ] && [ -d "$repo/.debs" ] && debs=$repo/.debs
offline=${ME_OFFLINE:-0}
[ -n "$debs" ] && offline=1
deps=${ME_DEPS_PREFIX:-/opt/deps}
build=${ME_BUILD_DIR:-$repo/build-release}
prefix=${ME_PREFIX:-/opt/megaengine}
venv=${ME_TORCH_VENV:-/opt/torch}
torch_version=${ME_TORCH_VERSION:-2.11.0}
torch_index=${ME_TORCH_INDEX:-https://download.pytorch.org/whl/cu130}
arch=${ME_CUDA_ARCH:-90}
jobs=${JOBS:-$(nproc)}
multiarch=x86_64-linux-gnu
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-${arch:0:-1}.${arch: -1}}  # 90 -> 9.0

# Pinned downloads (Dockerfile only). Catch2 2: Ubuntu 24.04 ships Catch2 3, the tests use 2.13;
# Debian 12's package is the same 2.13.10 as on the CPU machines (headers and CMake files only).
catch2_deb_url=https://deb.debian.org/debian/pool/main/c/catch2/catch2_2.13.10-1_amd64.deb
catch2_deb_sha256=0b32d3017609fecef1ecb0827729c2f3cda61332dd1f50da73ea9066fb4fc7ca
# EFA: libfabric (efa provider) and the aws-ofi-nccl NCCL plugin, built from source at release
# tags, checked against the tags' commits. aws-ofi-nccl 1.20.0 is tested with NCCL 2.28 and
# libfabric 2.4; --enable-platform-aws needs libfabric >= 1.22.
libfabric_tag=v2.4.0 libfabric_commit=5a13558c2fcea15f1a6c4e8c06dc702e50724cf8
ofi_nccl_tag=v1.20.0 ofi_nccl_commit=a2a6d08ea98296f99596b5c18b30b8a20d74f609

ubuntu_packages=(build-essential pkg-config git curl ca-certificates python3-venv python3-dev
  liblua5.4-dev libspdlog-dev libfmt-dev libedit-dev libpcre2-dev nlohmann-json3-dev
  libsentencepiece-dev sentencepiece)
efa_packages=(autoconf automake libtool libhwloc-dev libibverbs-dev librdmacm-dev rdma-core ibverbs-providers)

can_apt() { [ "$offline" != 1 ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; }
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  can_apt || die "missing packages ${missing[*]}, and apt is not usable here (offline or not root)"
  say "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The python3 whose torch provides LibTorch: ME_PYTHON, python3 on PATH, or the venv's.
torch_python() {
  local py
  for py in ${ME_PYTHON:-} python3 "$venv/bin/python3"; do
    command -v "$py" >/dev/null 2>&1 && "$py" -c 'import torch' 2>/dev/null && { command -v "$py"; return; }
  done
}

unpack_debs() {  # DIR: every .deb into $deps (dpkg -x: no scripts, no dpkg database)
  local f n=0
  mkdir -p "$deps"
  for f in "$1"/*.deb; do
    [ -e "$f" ] || continue
    dpkg -x "$f" "$deps"
    n=$((n + 1))
  done
  say "unpacked $n .deb files from $1 into $deps"
}

step_deps() {
  [ -n "$debs" ] && unpack_debs "$debs"
  if can_apt; then
    apt_install "${ubuntu_packages[@]}"
    [ -e /usr/include/nccl.h ] || apt_install libnccl-dev  # from the CUDA image's NVIDIA apt source
  fi
  if [ ! -e "$deps/usr/include/catch2/catch.hpp" ] && [ ! -e /usr/include/catch2/catch.hpp ]; then
    [ "$offline" != 1 ] || die "Catch2 2 (catch2/catch.hpp) not found: stage Debian's catch2 .deb (stage-debs.sh)"
    local tmp
    tmp=$(mktemp -d)
    curl -fsSL -o "$tmp/catch2.deb" "$catch2_deb_url"
    echo "$catch2_deb_sha256  $tmp/catch2.deb" | sha256sum -c --quiet - || die "catch2 .deb checksum mismatch"
    mkdir -p "$deps" && dpkg -x "$tmp/catch2.deb" "$deps" && rm -rf "$tmp"
    say "Catch2 2.13.10 unpacked into $deps"
  fi
  if [ -z "$(torch_python)" ]; then
    [ "$offline" != 1 ] || die "no python3 here imports torch; install torch $torch_version (cu130) first"
    say "installing torch $torch_version from $torch_index into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --no-cache-dir "torch==$torch_version" --index-url "$torch_index"
  fi
  # CMake and Ninja from PyPI next to torch, as on the GPU machine (CMake 4.x; Ubuntu's 3.28
  # predates CUDA 13).
  if ! PATH=$venv/bin:$PATH command -v cmake >/dev/null || ! PATH=$venv/bin:$PATH command -v ninja >/dev/null; then
    [ "$offline" != 1 ] || die "cmake or ninja not found"
    [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q --no-cache-dir "cmake>=3.31" ninja
  fi
  if ! ls assets/moby-dick.txt assets/gpt2-encoder.json assets/gpt2-vocab.bpe assets/gpt2-testplans.txt >/dev/null 2>&1; then
    # (ls fails when any one is missing: all four are needed)
    [ "$offline" != 1 ] || die "assets/ is incomplete: run scripts/fetch_assets.sh on a machine with network and carry assets/"
    bash scripts/fetch_assets.sh
  fi
}

step_efa() {
  apt_install "${efa_packages[@]}"
  [ "$offline" != 1 ] || die "the EFA step downloads libfabric and aws-ofi-nccl: not offline"
  local src
  src=$(mktemp -d)
  fetch_tag() {  # URL TAG COMMIT DIR
    git -c advice.detachedHead=false clone -q --depth 1 --branch "$2" "$1" "$4"
    [ "$(git -C "$4" rev-parse HEAD)" = "$3" ] || die "$1 tag $2 is not commit $3"
  }
  fetch_tag https://github.com/ofiwg/libfabric.git "$libfabric_tag" "$libfabric_commit" "$src/libfabric"
  (cd "$src/libfabric" && ./autogen.sh >/dev/null &&
   ./configure -q --prefix=/opt/amazon/efa --enable-efa --with-cuda=/usr/local/cuda --enable-cuda-dlopen \
     --disable-static | tee "$src/libfabric.configure" &&
   make -s -j "$jobs" >/dev/null && make -s install >/dev/null)
  grep -Eq "Built-in providers:.*\befa\b|DSO providers:.*\befa\b" "$src/libfabric.configure" ||
    die "libfabric was configured without the efa provider: $(grep -E 'providers:' "$src/libfabric.configure")"
  fetch_tag https://github.com/aws/aws-ofi-nccl.git "$ofi_nccl_tag" "$ofi_nccl_commit" "$src/aws-ofi-nccl"
  (cd "$src/aws-ofi-nccl" && PLUGIN_TAG=$ofi_nccl_tag ./autogen.sh >/dev/null 2>&1 &&
   ./configure -q --prefix=/opt/amazon/ofi-nccl --with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda \
     --enable-platform-aws --disable-tests &&
   make -s -j "$jobs" >/dev/null && make -s install >/dev/null)
  [ -e /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so ] || die "aws-ofi-nccl did not install libnccl-net-ofi.so"
  rm -rf "$src"
  say "libfabric $libfabric_tag (efa) in /opt/amazon/efa, aws-ofi-nccl $ofi_nccl_tag in /opt/amazon/ofi-nccl"
}

# What CMake, the compiler and the loader need to see the unpacked .debs and torch.
setup_env() {
  local py
  py=$(torch_python)
  [ -n "$py" ] || die "no python3 imports torch (run the deps step, or install torch $torch_version)"
  [ -x "$venv/bin/cmake" ] && export PATH=$venv/bin:$PATH
  torch_prefix=$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  torch_lib=$("$py" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  torch_cuda=$("$py" -c 'import torch; print(torch.version.cuda or "")')
  export CMAKE_PREFIX_PATH="$torch_prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ -d "$deps/usr" ]; then
    export CMAKE_PREFIX_PATH="$CMAKE_PREFIX_PATH:$deps/usr"
    export LD_LIBRARY_PATH="$deps/usr/lib/$multiarch:$LD_LIBRARY_PATH"
    export CPATH="$deps/usr/include/$multiarch${CPATH:+:$CPATH}"  # Lua's luaconf.h
    export PATH="$PATH:$deps/usr/bin"                               # spm_train & co. for the tests
  fi
  if [ -n "$debs" ]; then  # staged .pc files name /usr: read them relative to $deps (as device-env.sh)
    export PKG_CONFIG_PATH="$deps/usr/lib/$multiarch/pkgconfig:$deps/usr/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR=$deps
  fi
  say "torch $("$py" -c 'import torch; print(torch.__version__)') (CUDA ${torch_cuda:-none}) from $py; $(cmake --version | head -n 1)"
}

# Refuses a build that silently dropped a feature: each is optional in CMakeLists.txt.
check_complete() {
  local config=$build/generated/engine/core/build_config.h missing=()
  grep -q "define ME_HAVE_TOKENIZERS 1" "$config" || missing+=("GPT-2 tokenizer and preprocess (libpcre2-dev, nlohmann-json3-dev)")
  grep -q "libme_sentencepiece.so" "$build/build.ninja" || missing+=("SentencePiece tokenizer (libsentencepiece-dev)")
  grep -q "^EDITLINE_LIBRARY:FILEPATH=/" "$build/CMakeCache.txt" || missing+=("REPL line editing (libedit-dev)")
  if [ -n "$torch_cuda" ]; then
    grep -q "define ME_HAVE_CUDA_KERNELS 1" "$config" || missing+=("CUDA kernels (nvcc in /usr/local/cuda)")
    grep -q -- "-DME_HAVE_NCCL=1" "$build/build.ninja" || missing+=("NCCL backend (nccl.h and libnccl.so)")
  fi
  [ ${#missing[@]} -eq 0 ] || die "configured without: $(printf '%s; ' "${missing[@]}")(ME_ALLOW_MISSING=1 to build anyway)"
  say "configured with the tokenizers, SentencePiece, libedit${torch_cuda:+, CUDA kernels (sm_$arch), NCCL}"
}

step_build() {
  setup_env
  mkdir -p "$build"
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DME_CUDA_ARCH="$arch" \
    -DCMAKE_INSTALL_PREFIX="$prefix" >"$build/configure.log" 2>&1 || { tail -n 40 "$build/configure.log"; die "cmake configure failed"; }
  grep -iE "warning|not found" "$build/configure.log" | head -n 20 || true
  [ "${ME_ALLOW_MISSING:-0}" = 1 ] || check_complete
  cmake --build "$build" -j "$jobs"
}

step_test() {
  setup_env
  # shellcheck disable=SC2086  # ME_TEST_ARGS is a list of ctest arguments
  ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 600 ${ME_TEST_ARGS:-}
}

step_install() {
  setup_env
  cmake --install "$build" >/dev/null
  [ "$(id -u)" -eq 0 ] && ln -sf "$prefix/bin/megaengine" /usr/local/bin/megaengine
  "$prefix/bin/megaengine" --version
  [ -e "$prefix/bin/libme_sentencepiece.so" ] || die "libme_sentencepiece.so was not installed next to megaengine"
  "$prefix/bin/megaengine" preprocess --help | head -n 1
  say "installed $prefix/bin/megaengine and libme_sentencepiece.so${torch_cuda:+ (LibTorch from $torch_lib)}"
}

steps=("$@")
if [ ${#steps[@]} -eq 0 ] || [ "${steps[0]}" = all ]; then
  steps=(deps)
  [ "${ME_WITH_EFA:-0}" = 1 ] && steps+=(efa)
  steps+=(build test install)
fi
say "steps: ${steps[*]}; $([ "$offline" = 1 ] && echo "offline${debs:+, .debs from $debs}" || echo online); build dir $build"
for s in "${steps[@]}"; do
  case $s in
    deps | efa | build | test | install) "step_$s" ;;
    *) die "unknown step '$s' (deps, efa, build, test, install or all)" ;;
  esac
done
say "done: ${steps[*]}"
