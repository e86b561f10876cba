#!/usr/bin/env bash
# check_layers.sh [ROOT] - holds the source tree to the layer rules of ARCHITECTURE.md.
#
# The rules are the table between the `layers:begin` and `layers:end` markers of
# ROOT/ARCHITECTURE.md: one row per source folder, with the folders its files may
# include (a folder may always include itself). Every `#include "..."` in the .c, .h,
# .cu, .cuh and .cc files of those folders is checked; system headers (<...>) are not.
# Fails (exit 1) on:
#   - an include of a folder the row does not list (upwards, or across siblings that
#     must not know each other, e.g. runtime/comm -> runtime/train, launch -> kernels);
#   - an include that is not a path from the root (`#include "comm.h"`);
#   - a source folder under common, rendezvous, kernels, runtime or cli that has no row
#     (a new folder states its place in the layering before it holds code).
# tests/, scripts/ and configs/ are not layers: they may use anything.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
arch="$root/ARCHITECTURE.md"
[ -f "$arch" ] || { echo "check_layers: $arch not found" >&2; exit 2; }

# folder<TAB>allowed,comma,separated  (from rows like "| `runtime/comm` | common, kernels |")
rules=$(awk '
  /<!-- layers:begin -->/ { on = 1; next }
  /<!-- layers:end -->/   { on = 0 }
  on && /^\|/ {
    n = split($0, c, "|"); if (n < 4) next
    f = c[2]; a = c[3]
    gsub(/[` ]/, "", f); gsub(/[` ]/, "", a)
    if (f == "" || f ~ /^-+$/ || f == "folder") next
    if (a == "-" || a == "—") a = ""
    print f "\t" a
  }' "$arch")
[ -n "$rules" ] || { echo "check_layers: no layer table between the layers:begin/end markers of $arch" >&2; exit 2; }

declare -A allowed
while IFS=$'\t' read -r f a; do allowed[$f]=",$a,"; done <<<"$rules"

bad=0
report() { echo "layer violation: $*"; bad=$((bad + 1)); }

# Every source folder must have a row.
while IFS= read -r d; do
  d=${d#"$root"/}
  [ -n "${allowed[$d]+x}" ] || report "$d/ holds sources but has no row in ARCHITECTURE.md's layer table"
done < <(find "$root/common" "$root/rendezvous" "$root/kernels" "$root/runtime" "$root/cli" \
           -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cc' \) \
           -printf '%h\n' 2>/dev/null | sort -u)

for f in "${!allowed[@]}"; do
  [ -d "$root/$f" ] || continue
  while IFS= read -r hit; do
    file=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}; text=${rest#*:}
    inc=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' <<<"$text")
    [ -n "$inc" ] || continue
    rel=${file#"$root"/}
    case "$inc" in
      */*) ;;
      *) report "$rel:$line: #include \"$inc\" is not a path from the project root"; continue ;;
    esac
    to=$(dirname "$inc")
    [ "$to" = "$f" ] && continue
    case "${allowed[$f]}" in *",$to,"*) continue ;; esac
    list=${allowed[$f]#,}; list=${list%,}; list=${list//,/, }
    report "$rel:$line: includes \"$inc\" ($to/), but $f/ may include only: ${list:-nothing outside itself}"
  done < <(grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' \
             "$root/$f"/*.c "$root/$f"/*.h "$root/$f"/*.cu "$root/$f"/*.cuh "$root/$f"/*.cc 2>/dev/null || true)
done

if [ $bad -ne 0 ]; then
  echo "check_layers: $bad violation(s) of the layer rules in ARCHITECTURE.md"
  exit 1
fi
echo "check_layers: $(wc -l <<<"$rules") folders, every include follows ARCHITECTURE.md"
