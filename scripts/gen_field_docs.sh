#!/usr/bin/env bash
# gen_field_docs.sh [--check] [MEGAENGINE]: the field reference of docs/recipes.md is the output
# of `megaengine --fields`, pasted between the markers
#   <!-- BEGIN megaengine --fields (scripts/gen_field_docs.sh) -->  and  <!-- END megaengine --fields -->
# This rewrites that block from the binary (default build/megaengine). With --check it changes
# nothing and exits 1 with a diff when the page differs from the binary (CTest docs.fields_reference).
# Run it after changing bindings/lua/fields.lua. DOC=path picks another page (the test's own check).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
bin=${1:-$repo/build/megaengine}
doc=${DOC:-$repo/docs/recipes.md}
begin='<!-- BEGIN megaengine --fields (scripts/gen_field_docs.sh) -->'
end='<!-- END megaengine --fields -->'
[ -x "$bin" ] || { echo "gen_field_docs: no megaengine binary at $bin (build it, or pass its path)" >&2; exit 2; }
[ -f "$doc" ] || { echo "gen_field_docs: no page $doc" >&2; exit 2; }
for m in "$begin" "$end"; do
  [ "$(grep -cxF -- "$m" "$doc")" = 1 ] || { echo "gen_field_docs: $doc needs the line '$m' exactly once" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{ echo '```text'; "$bin" --fields; echo '```'; } >"$tmp/block"
# Everything up to the begin marker, the block, everything from the end marker on.
awk -v b="$begin" -v e="$end" -v blockfile="$tmp/block" '
  $0 == e { skip = 0 }
  !skip { print }
  $0 == b { while ((getline line < blockfile) > 0) print line; skip = 1 }
' "$doc" >"$tmp/new"
if [ $check = 1 ]; then
  if ! diff -u "$doc" "$tmp/new" >"$tmp/diff"; then
    echo "FAILED: $doc is stale: its field reference differs from \`megaengine --fields\`." >&2
    echo "Run: bash scripts/gen_field_docs.sh $bin" >&2
    head -60 "$tmp/diff" >&2
    exit 1
  fi
  echo "gen_field_docs: $doc matches megaengine --fields ($(grep -c '' "$tmp/block") lines)"
else
  cp "$tmp/new" "$doc"
  echo "gen_field_docs: rewrote the field reference in $doc"
fi
