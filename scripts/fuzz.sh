#!/usr/bin/env bash
# fuzz.sh - runs libFuzzer targets built by `make fuzz` (build-fuzz/fuzz_NAME), each
# for FUZZ_SECONDS (default 60) from its seeds, and prints one line per target:
# inputs executed, seconds, findings, peak RSS.
#
#   scripts/fuzz.sh NAME...      (make fuzz FUZZ_TARGETS="NAME...")
#
# Each run: -rss_limit_mb=2048 (a larger allocation or footprint is a finding),
# -timeout=10 (an input taking longer is a finding), corpus build-fuzz/corpus-NAME
# (kept between runs), seeds tests/fuzz/seeds_NAME, findings under
# build-fuzz/artifacts/NAME/, the full log build-fuzz/NAME.log. Exits 1 when any
# target found something.
set -u
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-60}
# The longest input worth trying, per target (a shard has a 1 KiB header).
max_len() {
  case $1 in
    tokenizer|chat_template) echo 16384 ;;
    shard) echo 8192 ;;
    *) echo 4096 ;;
  esac
}
seeds_of() { [ "$1" = store_frame ] && echo tests/fuzz/seeds || echo "tests/fuzz/seeds_$1"; }

summary=build-fuzz/summary.txt
printf '%-16s %12s %8s %9s %10s  %s\n' target inputs seconds findings peak_rss note | tee "$summary"
status=0
for t in "$@"; do
  bin=build-fuzz/fuzz_$t
  corpus=build-fuzz/corpus-$t
  art=build-fuzz/artifacts/$t
  log=build-fuzz/$t.log
  mkdir -p "$corpus" "$art"
  seeds=$(seeds_of "$t")
  [ -d "$seeds" ] || seeds=
  start=$(date +%s)
  "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -max_len="$(max_len "$t")" -artifact_prefix="$art/" "$corpus" $seeds >"$log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
  if [ -z "$execs" ]; then # a crash ends the run before the final stats: the last status line
    execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
    rss=$(grep -o 'rss: [0-9]*Mb' "$log" | tail -1 | grep -o '[0-9]*')
  fi
  found=0 note=
  if [ $rc -ne 0 ]; then
    found=1 status=1
    kind=$(grep -o -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|libFuzzer): [a-z-]+|runtime error|deadly signal|out-of-memory|timeout' "$log" | head -1)
    note="${kind:-exit $rc}: $(ls "$art" | tail -1)"
  fi
  printf '%-16s %12s %8s %9s %8sMB  %s\n' "$t" "${execs:-?}" "$took" "$found" "${rss:-?}" "$note" | tee -a "$summary"
done
exit $status
