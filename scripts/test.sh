#!/usr/bin/env bash
# README command 2 (and CI): set everything up, then run every test through CTest.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/scripts/setup.sh"
# A failing test is run once more (multi-process tests on a loaded 2-core machine have failed
# intermittently, cause not yet found); a retry shows in the log as a failure then a pass.
ctest --test-dir "${BUILD_DIR:-$repo/build}" --output-on-failure -j "${JOBS:-2}" --timeout 600 --repeat until-pass:2
