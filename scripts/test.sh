#!/usr/bin/env bash
# README command 2 (and CI): set everything up, then run every test through CTest.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/scripts/setup.sh"
ctest --test-dir "${BUILD_DIR:-$repo/build}" --output-on-failure -j "${JOBS:-2}" --timeout 600
