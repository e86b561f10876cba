#!/usr/bin/env bash
# test_blas_lazy.sh - OpenBLAS is loaded by the processes that compute on the CPU,
# not linked into dtrun: the agent and --exec workers never map it, a CPU worker
# does, and with OpenBLAS unloadable (a mount namespace binding an empty file over
# it) dtrun still starts and launches, while CPU training fails naming the library.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

n=$(ldd "$DTRUN" | grep -c openblas)
[ "$n" -eq 0 ] && pass "ldd dtrun lists no OpenBLAS" || fail "ldd dtrun lists no OpenBLAS" "$(ldd "$DTRUN" | grep openblas)"

# The agent's maps, read by its --exec child, and the child's own.
out=$("$DTRUN" --standalone --nproc_per_node 1 --exec sh -c \
  'echo "agent $(grep -c openblas /proc/$PPID/maps) self $(grep -c openblas /proc/self/maps)"' 2>&1)
grep -q '\[rank0\]:agent 0 self 0$' <<<"$out" && pass "the agent and an --exec worker map no OpenBLAS" ||
  fail "the agent and an --exec worker map no OpenBLAS" "$out"

# A CPU worker does map it: the agent's child is polled while it trains.
"$DTRUN" --standalone --nproc_per_node 1 "$ROOT/configs/mlp-tiny.json" train_steps=3000 steps_per_print=1000 \
  log.dir="$DT_TMP/cpu" >"$DT_TMP/cpu.out" 2>&1 &
agent=$!
mapped=""
for _ in $(seq 1 200); do
  w=$(pgrep -P "$agent" | head -1)
  if [ -n "$w" ] && grep -q openblas "/proc/$w/maps" 2>/dev/null; then mapped=yes; break; fi
  kill -0 "$agent" 2>/dev/null || break
  sleep 0.02
done
wait "$agent"; rc=$?
[ $rc -eq 0 ] && [ "$mapped" = yes ] && pass "a CPU training worker loads OpenBLAS and trains" ||
  fail "a CPU training worker loads OpenBLAS" "rc=$rc mapped=${mapped:-no}: $(tail -3 "$DT_TMP/cpu.out")"

# OpenBLAS unloadable.
blas=$(readlink -f "$(ldconfig -p | awk '/libopenblas\.so\.0 / {print $NF; exit}')")
if ! unshare -m --propagation private true 2>/dev/null; then
  skip "OpenBLAS hidden" "unshare -m is not permitted here (needs root or user namespaces)"
elif [ ! -f "$blas" ]; then
  skip "OpenBLAS hidden" "no libopenblas.so.0 in the loader cache"
else
  cat >"$DT_TMP/hide.sh" <<SH
empty=\$(mktemp); mount --bind "\$empty" "$blas" || exit 98
"\$@"
SH
  unshare -m --propagation private bash "$DT_TMP/hide.sh" "$DTRUN" --standalone --nproc_per_node 2 --exec true \
    >"$DT_TMP/h_exec.out" 2>&1
  rc=$?
  [ $rc -eq 0 ] && pass "OpenBLAS hidden: dtrun launches --exec workers" ||
    fail "OpenBLAS hidden: --exec" "exit $rc: $(tail -3 "$DT_TMP/h_exec.out")"
  unshare -m --propagation private bash "$DT_TMP/hide.sh" "$DTRUN" config "$ROOT/configs/mlp-tiny.json" \
    >"$DT_TMP/h_config.out" 2>&1
  rc=$?
  [ $rc -eq 0 ] && pass "OpenBLAS hidden: dtrun config works" ||
    fail "OpenBLAS hidden: dtrun config" "exit $rc: $(tail -3 "$DT_TMP/h_config.out")"
  unshare -m --propagation private bash "$DT_TMP/hide.sh" timeout 60 "$DTRUN" --standalone --nproc_per_node 1 \
    "$ROOT/configs/mlp-tiny.json" train_steps=2 log.dir="$DT_TMP/h_cpu" >"$DT_TMP/h_cpu.out" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
     grep -q 'the CPU device needs OpenBLAS (libopenblas.so.0), which could not be loaded' "$DT_TMP/h_cpu.out"; then
    pass "OpenBLAS hidden: CPU training fails naming libopenblas.so.0"
  else fail "OpenBLAS hidden: CPU training" "exit $rc: $(tail -4 "$DT_TMP/h_cpu.out")"; fi
fi
finish
