#!/usr/bin/env bash
# README command 1: set everything up, then train the embedded default recipe on the CPU.
# Extra arguments are overrides, e.g. scripts/run.sh train.iters=200
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bash "$repo/scripts/setup.sh"
cd "$repo"
exec "${BUILD_DIR:-$repo/build}/megaengine" recipes/gpt_tiny.lua "$@"
