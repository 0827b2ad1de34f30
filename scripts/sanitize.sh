#!/usr/bin/env bash
# scripts/sanitize.sh [--build-only | --no-build] [ctest options...]
# Builds megaengine and its CPU tests with AddressSanitizer + UndefinedBehaviorSanitizer (gcc,
# into build-asan/ or ASAN_BUILD_DIR) and runs them through CTest (all but the CUDA kernel
# checkers and the fuzz targets, which have their own sanitizers; extra arguments go to ctest,
# e.g. -R 'comm\.'). Not part of CI: it takes about an hour on 2 cores.
#
# Every sanitizer report of every process (ranks and children included) is written under
# build-asan/sanitizer-reports/ rather than only into a test's output, because a test that
# expects a failure would otherwise pass over a report printed on its way out. The script
# lists the reports and exits 1 if there is any, or if a test failed.
#
# LibTorch, Gloo, OpenBLAS and Lua are not instrumented; what they need is in
# scripts/sanitize/lsan.supp (leaks of their process-lifetime singletons, each explained there).
set -euo pipefail
step=all
case "${1:-}" in --build-only) step=build; shift ;; --no-build) step=test; shift ;; esac
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${ASAN_BUILD_DIR:-$repo/build-asan}
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
if [ ! -f "$build/build.ninja" ]; then
  # Build type "Asan": -O1 (fast enough for the training tests, stacks still readable) and full
  # debug info; the sanitizer flags go to every object, so the precompiled headers match.
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Asan -DCMAKE_CXX_FLAGS_ASAN="-O1 -g -DNDEBUG" \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" \
    >/dev/null
fi
# (Catch's test discovery runs the test programs during the build: no leak report there.)
if [ "$step" != test ]; then
  ASAN_OPTIONS=detect_leaks=0 cmake --build "$build" -j "${JOBS:-2}"  # every target: the CLI tests use the tools too
fi
[ "$step" = build ] && exit 0

reports=$build/sanitizer-reports
rm -rf "$reports"
mkdir -p "$reports"
export ASAN_OPTIONS="log_path=$reports/asan:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
export LSAN_OPTIONS="suppressions=$repo/scripts/sanitize/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="log_path=$reports/ubsan:print_stacktrace=1:halt_on_error=1"
set +e
# Left out besides: the LLaMA cluster recipe's run, whose SentencePiece cannot load next to
# LibTorch without RTLD_DEEPBIND, which ASan refuses (engine/data/sentencepiece_tokenizer.cpp).
ctest --test-dir "$build" --output-on-failure -j "${JOBS:-2}" --timeout 1800 \
  -E '^(kernels|fuzz)\.|^train\.cluster_recipe_llama2_70b$' "$@"
rc=$?
set -e
found=$(find "$reports" -type f | sort)
if [ -n "$found" ]; then
  echo "sanitize.sh: sanitizer reports:"
  for f in $found; do
    echo "=== $f"
    cat "$f"
  done
  exit 1
fi
echo "sanitize.sh: no sanitizer reports; ctest exit $rc"
exit $rc
