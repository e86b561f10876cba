#!/usr/bin/env bash
# test_store_cli.sh - `dtrun store` as its own process (the form torch scripts and
# the benchmark talk to) and `dtrun bench store` driving it over loopback.
source "$(dirname "$0")/lib.sh"

out=$DT_TMP/store.out
"$DTRUN" store --host 127.0.0.1 --port 0 >"$out" 2>"$DT_TMP/store.err" &
pid=$!
line=""
for _ in $(seq 1 100); do
  line=$(head -n1 "$out" 2>/dev/null)
  [ -n "$line" ] && break
  sleep 0.05
done
port=${line##*:}
if [[ "$line" =~ ^dtrun\ store\ listening\ on\ 127\.0\.0\.1:[0-9]+$ ]] && [ "$port" -gt 0 ]; then
  pass "store prints its bound port on the first line"
else
  fail "store prints its bound port on the first line" "got '$line'"
fi

bench=$("$DTRUN" bench store --connect "127.0.0.1:$port" --conns 16,128 --reps 1 --seconds 0.2 2>&1)
rc=$?
if [ $rc -eq 0 ] && echo "$bench" | grep -Eq '^barrier +128 +[0-9.]+ ' &&
   echo "$bench" | grep -Eq '^setget +16 +[0-9]+ '; then
  pass "bench store --connect drives an external dtrun store"
else
  fail "bench store --connect drives an external dtrun store" "rc=$rc: $bench"
fi

# The port is taken now: a second server must say so and exit 3.
"$DTRUN" store --host 127.0.0.1 --port "$port" >/dev/null 2>"$DT_TMP/second.err"
rc=$?
if [ $rc -eq 3 ] && grep -q "in use" "$DT_TMP/second.err"; then
  pass "store on a busy port exits 3 naming the problem"
else
  fail "store on a busy port exits 3 naming the problem" "rc=$rc $(cat "$DT_TMP/second.err")"
fi

kill -TERM "$pid"
wait "$pid"
rc=$?
check "store exits 0 on SIGTERM" [ $rc -eq 0 ]
if grep -q "Sanitizer" "$DT_TMP/store.err"; then
  fail "store process ends clean under sanitizers" "$(grep -A5 Sanitizer "$DT_TMP/store.err" | head -20)"
else
  pass "store process ends clean under sanitizers"
fi

"$DTRUN" store --port 70000 >/dev/null 2>"$DT_TMP/usage.err"
rc=$?
if [ $rc -eq 2 ] && grep -q -- "--port" "$DT_TMP/usage.err"; then
  pass "store rejects a bad port with exit 2"
else
  fail "store rejects a bad port with exit 2" "rc=$rc"
fi
"$DTRUN" bench store --conns 0 >/dev/null 2>&1
check "bench store rejects --conns 0 with exit 2" [ $? -eq 2 ]
"$DTRUN" bench store --connect nohostport >/dev/null 2>&1
check "bench store rejects --connect without a port with exit 2" [ $? -eq 2 ]
finish
