# lib.sh - helpers for integration tests (sourced). Each case prints one of
#   PASS: name   FAIL: name   SKIP: name: reason
# and the script exits non-zero if any case failed.
set -u
DTRUN=${DTRUN:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/dtrun}
DT_FAILS=0
DT_TMP=$(mktemp -d /tmp/dtrun-it.XXXXXX)
trap 'rm -rf "$DT_TMP"' EXIT

pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1${2:+: $2}"; DT_FAILS=$((DT_FAILS + 1)); }
skip() { echo "SKIP: $1: $2"; }
# check NAME COMMAND...: passes when the command exits 0
check() { local n=$1; shift; if "$@"; then pass "$n"; else fail "$n"; fi; }
# want NAME RC TEXT CMD...: a refusal before start. CMD exits RC within WANT_TIMEOUT
# seconds (default 60; killed past it, so a hang fails), no worker started (no
# "[rank" line), and its stderr holds TEXT (when not empty). Its output stays in
# $DT_TMP/want.out and want.err.
want() {
  local name=$1 rc=$2 text=$3 o="$DT_TMP/want.out" e="$DT_TMP/want.err"; shift 3
  timeout -s KILL "${WANT_TIMEOUT:-60}" "$@" >"$o" 2>"$e"; local got=$?
  if [ "$got" -ne "$rc" ]; then fail "$name" "exit $got, expected $rc: $(head -c 400 "$e")"; return; fi
  if grep -q '^\[rank' "$o" "$e"; then fail "$name" "a worker started"; return; fi
  if [ -n "$text" ] && ! grep -qF -- "$text" "$e"; then fail "$name" "no <$text> in: $(head -c 400 "$e")"; return; fi
  pass "$name"
}
# A free TCP port on loopback (the kernel picks it).
# losses RUN_LOG_DIR: "step loss" per metrics.jsonl row (loss exact: repr)
losses() { python3 -c 'import json,sys; [print(json.loads(l)["step"], repr(json.loads(l)["loss"])) for l in open(sys.argv[1])]' "$1/metrics.jsonl"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
finish() { exit $(( DT_FAILS > 0 )); }
# gone SECONDS PID...: until none of the PIDs is a live process (a zombie counts as
# gone); fails after SECONDS. For "nothing survives" checks: a fixed sleep before
# looking fails on a slow or loaded machine, where the kernel reaps later.
gone() {
  local t=$1 p st; shift
  for _ in $(seq $(( t * 20 ))); do
    local any=0
    for p in "$@"; do st=$(awk '{print $3}' /proc/$p/stat 2>/dev/null) && [ -n "$st" ] && [ "$st" != Z ] && any=1; done
    [ $any = 0 ] && return 0; sleep 0.05
  done
  return 1
}
# make_text FILE SEED LINES: a small corpus of random sentences from 14 words,
# enough structure for a tiny GPT to learn (the same bytes for the same seed).
make_text() {
  python3 - "$1" "$2" "$3" <<'PY'
import random, sys
random.seed(int(sys.argv[2]))
words = "the quick brown fox jumps over a lazy dog while seven tired cats sleep".split()
open(sys.argv[1], "w").write("".join(" ".join(random.choice(words) for _ in range(random.randint(3, 9))) + ".\n"
                                     for _ in range(int(sys.argv[3]))))
PY
}
