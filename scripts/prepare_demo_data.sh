#!/usr/bin/env bash
# prepare_demo_data.sh - builds the demo corpus from Debian's fortunes package
# (installed by install-deps.sh): every fortune file's text, '%' separators turned
# into blank lines, into runs/data/fortunes.txt (about 1.5 MB of English).
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/data/fortunes.txt
[ -s "$out" ] && exit 0
src=/usr/share/games/fortunes
[ -d "$src" ] || { echo "prepare_demo_data: $src is missing (apt-get install fortunes)" >&2; exit 1; }
mkdir -p runs/data
tmp=$(mktemp runs/data/.fortunes.XXXXXX)
for f in "$src"/*; do
  case "$f" in *.dat|*.u8) continue ;; esac
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  # Drop backspace overstriking and keep printable ASCII.
  sed -e 's/^%$//' -e 's/.\x08//g' "$f" | LC_ALL=C tr -cd '\11\12\15\40-\176'
done > "$tmp"
mv "$tmp" "$out"
echo "prepare_demo_data: wrote $out ($(wc -c < "$out") bytes)" >&2
