#!/usr/bin/env bash
# run_tests.sh - runs every Criterion binary under $BUILD/tests and every
# tests/integration/test_*.sh, then prints one summary line:
#   tests: N passed, N failed, N skipped
# Integration scripts report each case as "PASS: name", "FAIL: name" or
# "SKIP: name: reason" (tests/integration/lib.sh). A test binary or script that
# fails is shown and run once more: failing twice fails the run, passing the
# second time is reported as FLAKY by name (a bug to fix, not a pass to forget).
# Environment: DTRUN (binary under test), BUILD (build folder), ONLY (regex on names),
# TIER (long: only the long scenarios, tests/long/test_*.sh, which `make test-long`
# and CI run; `make test` runs everything else).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export DTRUN=${DTRUN:-$PWD/dtrun}
export DTRUN_TEST_BUILD=$PWD/$BUILD
# Time limits inside tests stretch under the sanitizers (several times slower).
[ "${SAN:-0}" = 1 ] && export DTRUN_TEST_TIME_SCALE=${DTRUN_TEST_TIME_SCALE:-4}
ONLY=${ONLY:-.}
passed=0; failed=0; skipped=0; failed_names=(); flaky_names=()

# The CUDA emulator's test binaries (build-emu/, tests/cuemu/cuemu.mk), not under SAN.
emu_tests=()
[ "${SAN:-0}" = 1 ] || mapfile -t emu_tests < <(find build-emu/tests -type f -name 'test_*' -perm -u+x 2>/dev/null | sort)
TIER=${TIER:-main}
units=("$BUILD"/tests/test_* "${emu_tests[@]}")
scripts=(tests/integration/test_*.sh)
[ "$TIER" = long ] && units=() && scripts=(tests/long/test_*.sh)
for t in "${units[@]}"; do
  [ -x "$t" ] || continue
  name=$(basename "$t"); case "$t" in build-emu/*) name="emu/$name" ;; esac
  echo "$name" | grep -Eq "$ONLY" || continue
  # Multi-process tests (comm) run one at a time: their ranks spin, and two such
  # tests at once on 2 cores starve each other.
  jobs=(); case "$name" in test_comm|test_comm_faults) jobs=(--jobs 1) ;; esac
  for attempt in 1 2; do
    out=$("$t" "${jobs[@]}" 2>&1); rc=$?
    syn=$(printf '%s\n' "$out" | grep -a 'Synthesis:' | tail -1)
    tested=$(printf '%s' "$syn" | sed -n 's/.*Tested: \([0-9]*\).*/\1/p')
    passing=$(printf '%s' "$syn" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
    if [ -z "$tested" ]; then tested=1; passing=0; fi
    bad=$((tested - passing))
    [ $rc -ne 0 ] && [ $bad -eq 0 ] && bad=1
    [ $bad -eq 0 ] && break
    # Show every failure; a binary that fails and then passes is reported as
    # FLAKY by name (it still needs fixing), one that fails twice fails the run.
    printf '%s\n' "$out" | grep -av '^\[----\]\|^\[RUN \]\|^\[PASS\]' | tail -40
    [ $attempt -eq 1 ] && echo "$name failed (attempt 1); running it once more"
  done
  [ $bad -eq 0 ] && [ $attempt -eq 2 ] && flaky_names+=("$name")
  passed=$((passed + passing)); failed=$((failed + bad))
  [ $bad -ne 0 ] && failed_names+=("$name")
  printf '%-28s %s\n' "$name" "${syn#*Synthesis: }"
done

for s in "${scripts[@]}"; do
  [ -f "$s" ] || continue
  name=$(basename "$s" .sh)
  echo "$name" | grep -Eq "$ONLY" || continue
  log=$(mktemp)
  start=$(date +%s)
  for attempt in 1 2; do
    bash "$s" >"$log" 2>&1; rc=$?
    p=$(grep -ac '^PASS: ' "$log"); f=$(grep -ac '^FAIL: ' "$log"); k=$(grep -ac '^SKIP: ' "$log")
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    [ "$f" -eq 0 ] && break
    grep -a -B2 -A20 '^FAIL: ' "$log" | tail -60
    [ $rc -ne 0 ] && tail -20 "$log"
    [ $attempt -eq 1 ] && echo "$name failed (attempt 1); running it once more"
  done
  [ "$f" -eq 0 ] && [ $attempt -eq 2 ] && flaky_names+=("$name")
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + k))
  [ "$f" -ne 0 ] && failed_names+=("$name")
  grep -a '^SKIP: ' "$log"
  printf '%-28s passed %d, failed %d, skipped %d (%ds)\n' "$name" "$p" "$f" "$k" $(( $(date +%s) - start ))
  rm -f "$log"
done

# The summary names every retried test, the ones that then passed too: a retry
# hides nothing.
[ ${#flaky_names[@]} -ne 0 ] && echo "FLAKY (failed once, passed on retry; see above): ${flaky_names[*]}"
[ ${#failed_names[@]} -ne 0 ] && echo "failing: ${failed_names[*]}"
for n in "${flaky_names[@]}" "${failed_names[@]}"; do echo "retried: $n"; done
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
