#!/usr/bin/env bash
# On the head node (Docker and Enroot, no GPU needed): build the image, then turn it into the
# squashfs file that Pyxis runs, as the seeds do:
#   container/enroot.sh [OUTPUT.sqsh]       (default /fsx/megaengine.sqsh, else ./megaengine.sqsh)
# Then: IMAGE=/fsx/megaengine.sqsh sbatch slurm/train.sbatch recipes/llama2_70b.lua
# Environment: IMAGE_NAME (megaengine), ME_CUDA_ARCH (90 = H100), DOCKER_BUILD_ARGS (extra args).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
name=${IMAGE_NAME:-megaengine}
out=${1:-}
if [ -z "$out" ]; then
  if [ -d /fsx ] && [ -w /fsx ]; then out=/fsx/$name.sqsh; else out=$PWD/$name.sqsh; fi
fi
for tool in docker enroot; do
  command -v "$tool" >/dev/null || { echo "enroot.sh: $tool is not installed on this machine" >&2; exit 1; }
done
[ -e "$repo/assets/moby-dick.txt" ] || echo "enroot.sh: assets/ not fetched here; the image build fetches them (needs network)"

# shellcheck disable=SC2086  # DOCKER_BUILD_ARGS is a list of arguments
docker build -t "$name:latest" -f "$repo/container/Dockerfile" \
  --build-arg ME_CUDA_ARCH="${ME_CUDA_ARCH:-90}" ${DOCKER_BUILD_ARGS:-} "$repo"
rm -f "$out"  # enroot import refuses to overwrite
enroot import -o "$out" "dockerd://$name:latest"
echo "enroot.sh: wrote $out ($(du -h "$out" | cut -f1)); run it with IMAGE=$out sbatch slurm/train.sbatch RECIPE"
