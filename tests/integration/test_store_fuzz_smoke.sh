#!/usr/bin/env bash
# test_store_fuzz_smoke.sh - a few seconds of the store's libFuzzer targets (the long
# runs are `make fuzz` and `make fuzz-server`), built with clang when clang has
# libFuzzer: the frame parser (seeds plus 30000 mutations), then the running server
# fed sequences of frames over several connections at once (seeds plus 5000
# scripts; after each the server must answer a bystander and let go of every
# connection). Expects no crash, hang or sanitizer report.
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

sbin=$DT_TMP/fuzz_store_server
if ! clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -I. \
     tests/fuzz/fuzz_store_server.c rendezvous/store_server*.c rendezvous/store_auth.c rendezvous/store_client.c common/sha256.c common/rng.c common/fs.c common/fs_safe.c \
     rendezvous/proto.c common/status.c common/mem.c common/log.c common/clock.c \
     -luv -lpthread -o "$sbin" 2>"$DT_TMP/cc2.err"; then
  fail "server fuzz smoke builds" "$(head -5 "$DT_TMP/cc2.err")"; finish
fi
mkdir -p "$DT_TMP/corpus2"
if timeout 300 "$sbin" -runs=5000 -max_len=4096 -seed=1 -timeout=20 -artifact_prefix="$DT_TMP/" \
     "$DT_TMP/corpus2" tests/fuzz/seeds_server tests/fuzz/seeds >"$DT_TMP/fuzz2.log" 2>&1; then
  pass "server fuzz smoke: 5000 scripts of frames over 4 connections, server alive and clean"
else
  fail "server fuzz smoke" "$(grep -A15 -E 'ERROR|deadly|crash|timeout' "$DT_TMP/fuzz2.log" | head -30)"
fi
finish
