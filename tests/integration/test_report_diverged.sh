#!/usr/bin/env bash
# test_report_diverged.sh - `dtrun report` on a diverged run: metrics.jsonl with
# NaN, Infinity and -Infinity (as Python's json writes them), 1e309 (past a double:
# parsed as infinity) and 1e308 gives a well-formed SVG (python3's XML parser reads
# it) with no "nan" or "inf" in it, every coordinate finite and inside the picture,
# the axes drawn from the finite points, and a line saying what was left out.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."

check_svg() { # name svg expected_left_out
  python3 - "$2" "$3" <<'PY' >"$DT_TMP/why" 2>&1 && pass "$1" || fail "$1" "$(cat "$DT_TMP/why")"
import math, re, sys, xml.etree.ElementTree as ET
path, want_left = sys.argv[1], sys.argv[2]
text = open(path).read()
bad = re.findall(r"(?i)nan|inf", text)
assert not bad, "non-finite text in the SVG: %s" % bad[:3]
root = ET.fromstring(text)  # well-formed
ns = "{http://www.w3.org/2000/svg}"
nums = []
for el in root.iter():
    for k in ("x", "y", "x1", "y1", "x2", "y2", "width", "height"):
        if k in el.attrib: nums.append(float(el.attrib[k]))
    if "points" in el.attrib:
        nums += [float(v) for p in el.attrib["points"].split() for v in p.split(",")]
assert nums and all(math.isfinite(v) and -1 <= v <= 1000 for v in nums), "coordinates outside the picture: %s" % \
    [v for v in nums if not (math.isfinite(v) and -1 <= v <= 1000)][:5]
labels = [float(t.text) for t in root.iter(ns + "text") if t.text and re.fullmatch(r"-?[0-9.]+(e[+-]?[0-9]+)?", t.text)]
assert labels and max(abs(v) for v in labels) < 1e6, "an axis spans the huge values: %s" % max(labels)
lines = [t.text for t in root.iter(ns + "text") if t.text and t.text.startswith("left out")]
assert lines and lines[0].startswith("left out: %s value(s)" % want_left), "no or wrong left-out line: %s" % lines
PY
}

mkdir -p "$DT_TMP/py" "$DT_TMP/big"
# Python-style non-finite literals, and a value past a double's range.
cat > "$DT_TMP/py/metrics.jsonl" <<'EOF2'
{"step": 1, "loss": 5.2, "tokens_per_s": 1000.0}
{"step": 2, "loss": 4.8, "tokens_per_s": 1010.0, "val_loss": 4.9}
{"step": 3, "loss": NaN, "tokens_per_s": Infinity}
{"step": 4, "loss": Infinity, "val_loss": -Infinity, "tokens_per_s": 1e309}
{"step": 5, "loss": 1e308, "tokens_per_s": 990.0, "note": "NaN inside a string stays"}
{"step": 6, "loss": 4.1, "tokens_per_s": 1005.0}
EOF2
if "$DTRUN" report "$DT_TMP/py" -o "$DT_TMP/py.svg" >"$DT_TMP/out" 2>&1; then
  check_svg "report: NaN/Infinity/1e309/1e308 left out, SVG well-formed and finite" "$DT_TMP/py.svg" 6
  grep -q "left out 6 value" "$DT_TMP/out" && pass "report: says on stdout what it left out" || fail "report: stdout" "$(cat "$DT_TMP/out")"
else fail "report: NaN/Infinity/1e309/1e308 left out, SVG well-formed and finite" "$(cat "$DT_TMP/out")"; fi

# Only JSON any parser reads: a loss that explodes to 1e308, then 1e309.
python3 -c '
import json
for s in range(1, 21):
    loss = 5.0 - 0.1 * s if s < 15 else (1e308 if s < 18 else None)
    print(json.dumps({"step": s, "loss": loss, "tokens_per_s": 1000.0 + s}).replace("null", "1e309"))
' > "$DT_TMP/big/metrics.jsonl"
if "$DTRUN" report "$DT_TMP/big" -o "$DT_TMP/big.svg" >"$DT_TMP/out" 2>&1; then
  check_svg "report: a loss diverging to 1e308 and 1e309, the axes from the finite points" "$DT_TMP/big.svg" 6
else fail "report: a loss diverging to 1e308 and 1e309" "$(cat "$DT_TMP/out")"; fi
finish
