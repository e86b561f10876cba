#!/usr/bin/env bash
# test_gpu_script.sh - the one-call GPU check (scripts/gpu_pack.sh, scripts/gpu_check.sh)
# without running its checks: both scripts parse; the emulator build packs into one
# archive under 60 MiB holding what the check runs (dtrun, the CUDA library beside it,
# every GPU test binary, OpenBLAS, which dtrun loads with dlopen) and no build
# leftovers; gpu_check.sh unpacks it to /tmp, its preflight resolves every packed
# binary's and library's libraries, and with GPU_CHECK_DEADLINE=0 every later row is
# SKIP with its reason; the table and one logs archive land in $OUT. The full
# emulator run (every check, about 30 s here) is `make test-gpu-script`.
# Writes .carry/gpu_check_emu.tar.gz (ignored by git) in the repository.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
for s in gpu_pack.sh gpu_check.sh; do
  err=$(bash -n "$ROOT/scripts/$s" 2>&1) && pass "scripts/$s parses" || fail "scripts/$s parses" "$err"
done
if [ ! -x "$ROOT/dtrun-emu" ] || [ ! -d "$ROOT/build-emu/tests/gpu" ]; then
  skip "gpu_check.sh on the emulator build" "no dtrun-emu (the emulator build is not part of SAN runs)"
  finish
fi

out=$DT_TMP/out
GPU_CHECK_EMU=1 GPU_CHECK_DEADLINE=0 OUT=$out timeout 300 bash "$ROOT/scripts/gpu_check.sh" >"$DT_TMP/run.log" 2>&1
rc=$?
[ $rc -eq 0 ] && pass "GPU_CHECK_EMU=1 GPU_CHECK_DEADLINE=0 gpu_check.sh exits 0" ||
  fail "GPU_CHECK_EMU=1 GPU_CHECK_DEADLINE=0 gpu_check.sh exits 0" "rc $rc: $(tail -5 "$DT_TMP/run.log")"

archive=$ROOT/.carry/gpu_check_emu.tar.gz
bytes=$(stat -c %s "$archive" 2>/dev/null || echo 0)
if [ "$bytes" -gt 0 ] && [ "$bytes" -lt $((60 * 1024 * 1024)) ]; then pass "packed archive is under 60 MiB ($((bytes / 1024)) KiB)"
else fail "packed archive is under 60 MiB" "$bytes bytes"; fi
tar -tzf "$archive" 2>/dev/null | sed 's|^\./||' | sort >"$DT_TMP/files"
want="bin/dtrun bin/libdtrun_cuda_emu.so lib/libopenblas.so.0 lib/libuv.so.1 lib/libcjson.so.1 lib/libcriterion.so.3"
for t in "$ROOT"/build-emu/tests/gpu/test_* "$ROOT/build-emu/tests/cuemu/test_cuemu"; do
  case "$t" in *.o|*.d) ;; *) want="$want bin/$(basename "$t")" ;; esac
done
miss=$(for f in $want; do grep -qx "$f" "$DT_TMP/files" || echo "$f"; done)
[ -z "$miss" ] && pass "the archive holds dtrun, its CUDA library, every GPU test binary and OpenBLAS" ||
  fail "the archive holds dtrun, its CUDA library, every GPU test binary and OpenBLAS" "missing: $(echo $miss)"
extra=$(grep -E '\.(o|d)$' "$DT_TMP/files")
[ -z "$extra" ] && pass "no objects or dependency files in the archive" ||
  fail "no objects or dependency files in the archive" "$(echo $extra)"

table=$out/table.txt
python3 - "$table" <<'PY' && pass "table: archive and preflight PASS, every other row SKIP with its reason" ||
import re, sys
rows = [l.rstrip("\n") for l in open(sys.argv[1])]
assert len(rows) >= 20, len(rows)
res = {}
for l in rows:
    m = re.match(r"(.*?) +(PASS|FAIL|SKIP) (.*)", l)
    assert m, l
    res[m.group(1).strip()] = (m.group(2), m.group(3))
assert res["archive .carry/gpu_check_emu.tar.gz"][0] == "PASS", res
pre = [v for k, v in res.items() if k.startswith("preflight")]
assert pre and pre[0][0] == "PASS", pre
for k, (r, why) in res.items():
    if k.startswith(("archive", "preflight")):
        continue
    assert r == "SKIP" and ("deadline" in why or "emulator" in why), (k, r, why)
PY
  fail "table: archive and preflight PASS, every other row SKIP with its reason" "$(cat "$table" 2>/dev/null)"
grep -q '^preflight: ldd of .* PASS' "$DT_TMP/run.log" && grep -q 'emulator semantics.*SKIP deadline' "$DT_TMP/run.log" &&
  pass "rows are printed as they go and again at the end" ||
  fail "rows are printed as they go and again at the end" "$(tail -30 "$DT_TMP/run.log")"
n=$(ls "$out" | wc -l)
if [ "$n" -eq 2 ] && tar -tzf "$out/logs.tar.gz" | grep -q '^logs/preflight.log$'; then
  pass "\$OUT holds table.txt and one logs.tar.gz (with the preflight log)"
else fail "\$OUT holds table.txt and one logs.tar.gz" "$(ls "$out")"; fi
finish
