#!/usr/bin/env bash
# test_store_fuzz_smoke.sh - a few seconds of the libFuzzer target for the store's
# frame parser (the long run is `make fuzz`): builds it with clang when clang has
# libFuzzer, runs the seeds plus 30000 mutations, expects no crash.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
if ! command -v clang >/dev/null 2>&1; then
  skip "fuzz smoke" "clang not installed"; finish
fi
bin=$DT_TMP/fuzz_store_frame
if ! clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -I. \
     tests/fuzz/fuzz_store_frame.c rendezvous/proto.c common/status.c common/mem.c \
     common/log.c common/clock.c -o "$bin" 2>"$DT_TMP/cc.err"; then
  if grep -qi "fuzzer" "$DT_TMP/cc.err"; then
    skip "fuzz smoke" "clang has no libFuzzer runtime"; finish
  fi
  fail "fuzz smoke builds" "$(head -5 "$DT_TMP/cc.err")"; finish
fi
mkdir -p "$DT_TMP/corpus"
if "$bin" -runs=30000 -max_len=4096 -seed=1 -artifact_prefix="$DT_TMP/" "$DT_TMP/corpus" tests/fuzz/seeds \
     >"$DT_TMP/fuzz.log" 2>&1; then
  pass "fuzz smoke: 30000 inputs through the frame parser, no crash"
else
  fail "fuzz smoke" "$(grep -A15 -E 'ERROR|deadly|crash' "$DT_TMP/fuzz.log" | head -30)"
fi
finish
