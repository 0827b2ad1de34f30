#!/usr/bin/env bash
# scripts/fuzz.sh TARGET SECONDS [libFuzzer options...]
# Builds the libFuzzer targets (tests/fuzz/, clang-14 with ASan + UBSan, in build-fuzz/ or
# FUZZ_BUILD_DIR) and runs TARGET for SECONDS on one core. Targets: see tests/fuzz/targets.cmake
# (hostlist, store_message, idx, jsonl_record, overrides). The seed corpus tests/fuzz/TARGET/
# is read, never written: new inputs go to FUZZ_BUILD_DIR/corpus/TARGET/, crashes to
# FUZZ_BUILD_DIR/crashes/TARGET/. Exit status: 0 when nothing was found, 1 on a finding (the
# input that triggers it is named; rerun it with: FUZZ_BUILD_DIR/fuzz_TARGET THAT_FILE).
#   scripts/fuzz.sh list           prints the targets
#   scripts/fuzz.sh build          only builds
#   scripts/fuzz.sh TARGET ci      CTest's run: FUZZ_SECONDS (default 12) seconds; the longer run
#                                  is FUZZ_SECONDS=30 ctest -R fuzz, or any SECONDS given here
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$repo/build-fuzz}
target=${1:?usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer options] | list | build}
targets=$(sed -n 's/^me_fuzz_target(\([a-z_0-9]*\).*/\1/p' "$repo/tests/fuzz/targets.cmake")
if [ "$target" = list ]; then echo "$targets"; exit 0; fi
cxx=${CXX_FUZZ:-$(command -v clang++-14 || command -v clang++ || true)}
if [ -z "$cxx" ]; then
  echo "fuzz.sh: clang++ not found: install clang-14 and libfuzzer-14-dev (scripts/setup.sh does)" >&2
  exit 2
fi
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$repo/tests/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
if [ "$target" = build ]; then
  cmake --build "$build" -j "${JOBS:-2}"
  exit 0
fi
if ! grep -qx "$target" <<<"$targets"; then
  echo "fuzz.sh: unknown target '$target'; targets: $(echo $targets)" >&2
  exit 2
fi
seconds=${2:?usage: scripts/fuzz.sh TARGET SECONDS}
[ "$seconds" = ci ] && seconds=${FUZZ_SECONDS:-12}
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: SECONDS must be a positive integer, got '$seconds'" >&2; exit 2; }
shift 2
cmake --build "$build" --target "fuzz_$target" -j "${JOBS:-2}" >/dev/null
corpus=$build/corpus/$target crashes=$build/crashes/$target
mkdir -p "$corpus" "$crashes"
# .idx files carry a header and tables: give them room; other inputs are lines or frames.
max_len=4096
[ "$target" = idx ] && max_len=65536
set +e
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$build/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=$max_len \
  -print_final_stats=1 -artifact_prefix="$crashes/" "$@" "$corpus" "$repo/tests/fuzz/$target" 2>&1 |
  tee "$build/$target.log" | grep -Ev '^#[0-9]+\s+(NEW|REDUCE|pulse)'
rc=${PIPESTATUS[0]}
set -e
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/$target.log" | tail -1)
echo "fuzz.sh: $target ran ${runs:-?} inputs in ${seconds} s; exit $rc"
if [ "$rc" -ne 0 ]; then
  echo "fuzz.sh: $target found a problem; the input is in $crashes/ (see $build/$target.log)" >&2
  exit 1
fi
