#!/usr/bin/env bash
# test_store_limits.sh - `dtrun store` as a separate process under attack from raw
# sockets (tests/integration/store_attack.py): its RSS under a client filling it, a
# PING flood that never reads and 300 clients that never send VALIDATE (figures
# printed; bounded unless under the sanitizers); 300 idle connections with a low
# file descriptor limit must not lock a legitimate client out; and an agent that
# reads a value a stranger wrote exits 3 naming the key instead of aborting.
source "$(dirname "$0")/lib.sh"
ATTACK="python3 $(cd "$(dirname "$0")" && pwd)/store_attack.py"
SAN_RUN=0
{ [ "${SAN:-0}" = 1 ] || [[ "$DTRUN" == *-san ]]; } && SAN_RUN=1

# start_store NAME [ulimit args]: starts `dtrun store` on a free port; sets
# store_pid and store_port.
start_store() {
  local name=$1; shift
  local out=$DT_TMP/$name.out
  ( [ $# -gt 0 ] && ulimit "$@"; exec "$DTRUN" store --host 127.0.0.1 --port 0 ) \
    >"$out" 2>"$DT_TMP/$name.err" &
  store_pid=$!
  store_port=""
  for _ in $(seq 1 100); do
    local line; line=$(head -n1 "$out" 2>/dev/null)
    [ -n "$line" ] && { store_port=${line##*:}; break; }
    sleep 0.05
  done
}
stop_store() { kill -TERM "$store_pid" 2>/dev/null; wait "$store_pid" 2>/dev/null; }

# ---- RSS under three attacks ----------------------------------------------------
for scenario in fill pingflood prevalid; do
  start_store "rss_$scenario"
  line=$($ATTACK rss "$store_pid" "$store_port" "$scenario" 2>&1)
  echo "RSS (KiB) $line"
  before=$(sed -n 's/.*before=\([0-9]*\).*/\1/p' <<<"$line")
  peak=$(sed -n 's/.*peak=\([0-9]*\).*/\1/p' <<<"$line")
  after=$(sed -n 's/.*after=\([0-9]*\).*/\1/p' <<<"$line")
  if [ -z "$before" ] || ! grep -q "legit=ok" <<<"$line"; then
    fail "store serves others after the $scenario attack" "$line"
  elif [ $SAN_RUN = 1 ]; then
    skip "store RSS bounded under $scenario" "sanitizer build (figures above)"
  else
    # Stored bytes are capped at 256 MiB; flood and strangers at a few MiB.
    case $scenario in fill) bound=$((400 * 1024)) ;; *) bound=$((64 * 1024)) ;; esac
    grow=$((peak - before)); kept=$((after - before))
    if [ $grow -le $bound ] && { [ $scenario = fill ] || [ $kept -le $bound ]; }; then
      pass "store RSS bounded under $scenario (grew $((grow / 1024)) MiB, bound $((bound / 1024)))"
    else
      fail "store RSS bounded under $scenario" "grew $((grow / 1024)) MiB, kept $((kept / 1024)) MiB"
    fi
  fi
  stop_store
done

# ---- file descriptors -------------------------------------------------------------
start_store fd_soft -Sn 256
lim=$(awk '/Max open files/ {print $4}' /proc/$store_pid/limits)
got=$($ATTACK idle "$store_port" 300 1 2>&1)
if [ "$got" = "legit ok" ] && [ "$lim" -gt 256 ]; then
  pass "soft fd limit 256 is raised to the hard one ($lim); 300 idle clients lock nobody out"
else
  fail "soft fd limit raised; 300 idle clients lock nobody out" "limit $lim: $got"
fi
stop_store

start_store fd_hard -n 256
got=$($ATTACK idle "$store_port" 300 1 2>&1)
if [ "$got" = "legit ok" ] && grep -q "file descriptor limit (256)" "$DT_TMP/fd_hard.err"; then
  pass "hard fd limit 256: 300 idle clients make room for a legitimate one, logged"
else
  fail "hard fd limit 256: 300 idle clients make room, logged" "$got: $(tail -3 "$DT_TMP/fd_hard.err")"
fi
stop_store

# ---- the agent checks what it reads --------------------------------------------------
start_store agent
$ATTACK set "$store_port" /dtrun/none/r0/complete 2000000000
timeout 60 "$DTRUN" --nnodes 2 --node_rank 1 --nproc_per_node 1 \
  --rdzv_endpoint "127.0.0.1:$store_port" --rdzv_conf join_timeout=20 --exec true \
  >"$DT_TMP/agent.out" 2>&1
rc=$?
if [ $rc -eq 3 ] && grep -q "/dtrun/none/r0/complete" "$DT_TMP/agent.out"; then
  pass "agent reading complete=2000000000 exits 3 naming the key"
else
  fail "agent reading complete=2000000000 exits 3 naming the key" "rc=$rc: $(tail -3 "$DT_TMP/agent.out")"
fi
stop_store
if grep -l "Sanitizer" "$DT_TMP"/*.err >/dev/null 2>&1; then
  fail "store processes end clean under sanitizers" "$(grep -h -A5 Sanitizer "$DT_TMP"/*.err | head -20)"
else
  pass "store processes end clean under sanitizers"
fi
finish
