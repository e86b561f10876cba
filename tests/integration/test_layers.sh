#!/usr/bin/env bash
# test_layers.sh - the layer rules of ARCHITECTURE.md hold for the tree
# (scripts/check_layers.sh), and the checker really catches each kind of break: an
# include upwards, across siblings that must not know each other, from the launcher
# into devices, by a bare file name, and a source folder with no row.
source "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
chk="$root/scripts/check_layers.sh"

out=$("$chk" "$root" 2>&1); rc=$?
if [ $rc -eq 0 ]; then pass "the tree follows ARCHITECTURE.md's layer rules"
else fail "the tree follows ARCHITECTURE.md's layer rules" "$out"; fi

# copy: a scratch copy of the layered folders and the rules.
copy() {
  rm -rf "$DT_TMP/t"; mkdir -p "$DT_TMP/t"
  cp -r "$root/ARCHITECTURE.md" "$root/common" "$root/rendezvous" "$root/kernels" \
        "$root/runtime" "$root/cli" "$DT_TMP/t/"
}
# breaks NAME FILE INCLUDE EXPECT: adding `#include "INCLUDE"` to FILE fails the check
# with a message matching EXPECT (a regex) that names FILE.
breaks() {
  local name=$1 file=$2 inc=$3 expect=$4
  copy; printf '#include "%s"\n' "$inc" >>"$DT_TMP/t/$file"
  out=$("$chk" "$DT_TMP/t" 2>&1); rc=$?
  if [ $rc -eq 1 ] && grep -q "^layer violation: $file:[0-9]*: " <<<"$out" && grep -Eq "$expect" <<<"$out"; then
    pass "$name"
  else fail "$name" "rc=$rc: $out"; fi
}
breaks "upwards: comm includes the trainer" runtime/comm/comm.c runtime/train/trainer.h \
  'includes "runtime/train/trainer.h" \(runtime/train/\), but runtime/comm/ may include only'
breaks "siblings: model includes the config" runtime/model/net.c runtime/config/config.h 'runtime/model/ may include only'
breaks "launch includes kernels" runtime/launch/rdzv.c kernels/kernels.h 'runtime/launch/ may include only: common, rendezvous$'
breaks "common includes nothing outside itself" common/log.c rendezvous/store.h 'may include only: nothing outside itself'
breaks "a header counts too" runtime/ckpt/checkpoint.h runtime/train/trainer.h 'runtime/ckpt/ may include only'
breaks "a bare file name" runtime/comm/comm_tcp.c comm.h 'is not a path from the project root'

copy; mkdir -p "$DT_TMP/t/runtime/newthing"; echo 'int x;' >"$DT_TMP/t/runtime/newthing/a.c"
out=$("$chk" "$DT_TMP/t" 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -q 'runtime/newthing/ holds sources but has no row' <<<"$out"; then
  pass "a source folder without a row"
else fail "a source folder without a row" "rc=$rc: $out"; fi

copy; sed -i '/layers:begin/,/layers:end/d' "$DT_TMP/t/ARCHITECTURE.md"
out=$("$chk" "$DT_TMP/t" 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q 'no layer table' <<<"$out"; then pass "no rule table is an error, not a pass"
else fail "no rule table is an error, not a pass" "rc=$rc: $out"; fi
# ---- no call cycle between the files of cli/, runtime/train/, runtime/config/ and
# runtime/layout/ (scripts/check_cycles.py on the built objects), and the check sees one
build=${DTRUN_TEST_BUILD:-$root/build}
out=$(python3 "$root/scripts/check_cycles.py" "$build" cli runtime/train runtime/config runtime/layout 2>&1); rc=$?
if [ $rc -eq 0 ]; then pass "no call cycle among the files of cli/, train/, config/, layout/"
else fail "no call cycle among the files of cli/, train/, config/, layout/" "$out"; fi
mkdir -p "$DT_TMP/cyc/f"
printf 'int b(int);\nint a(int x) { return x ? b(x - 1) : 0; }\n' >"$DT_TMP/cyc/a.c"
printf 'int a(int);\nint b(int x) { return a(x); }\nint c(void) { return 1; }\n' >"$DT_TMP/cyc/b.c"
printf 'int c(void);\nint d(void) { return c(); }\n' >"$DT_TMP/cyc/d.c"
for f in a b d; do cc -c -o "$DT_TMP/cyc/f/$f.o" "$DT_TMP/cyc/$f.c"; done
out=$(python3 "$root/scripts/check_cycles.py" "$DT_TMP/cyc" f 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -q '^call cycle in f/: a, b: a -> b (b); b -> a (a)$' <<<"$out" && ! grep -q 'd' <<<"${out#call cycle in f/}"; then
  pass "the cycle check names a two-file cycle and its symbols, not a one-way call"
else fail "the cycle check catches a cycle" "rc=$rc: $out"; fi

finish
