#!/usr/bin/env bash
# test_tokenize.sh - `dtrun tokenize` as users run it, on real processes: the ids
# equal Hugging Face tokenizers' (tests/fixtures/tok/cli_expected.txt, made by
# make_cli_fixtures.py), the same bytes for every --jobs, llm.c headers of both
# widths, the val/train split and shard sizes, --decode, every bad input (exit 2,
# a message naming it, nothing written), signals (no partial shard), the progress
# line, and the README flow: tokenize, then train a tiny GPT on the shards.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
FX=tests/fixtures/tok
DOCS=$FX/cli_docs
INPUTS=("$DOCS/a.txt" "$DOCS/b.txt" "$DOCS/empty.txt" "$DOCS/c.jsonl" "$DOCS/big.txt")
TK() { "$DTRUN" tokenize "$@"; }

# shards FILE...: checks each llm.c header against the file size (and dtrun's
# vocabulary size in int32 number 3 against the ids) and prints
# "MAGIC VERSION WIDTH COUNT" per file, then every id of all files on one line.
shards() {
  python3 - "$@" <<'PY'
import struct, sys, os
ids = []
for p in sys.argv[1:]:
    b = open(p, "rb").read()
    magic, ver, n = struct.unpack("<3i", b[:12])
    w = {20240520: 2, 20240801: 4}[magic]
    assert (magic, ver) in ((20240520, 1), (20240801, 7)), (magic, ver)
    vocab, = struct.unpack("<i", b[12:16])  # dtrun's: the tokenizer's vocabulary size
    assert vocab > 0, "no vocabulary size in the header"
    assert b[16:1024] == bytes(1008), "header tail not zero"
    assert len(b) == 1024 + w * n, (p, len(b), n)
    print(magic, ver, w, n)
    got = struct.unpack("<%d%s" % (n, "H" if w == 2 else "I"), b[1024:])
    assert all(i < vocab for i in got), "an id past the header's vocabulary"
    ids += got
print(" ".join(map(str, ids)))
PY
}
expected() { sed -n "s/^$1 //p" "$FX/cli_expected.txt"; }
# no_files PREFIX: nothing at all (shard or temporary) starts with PREFIX
no_files() { ! compgen -G "$1*" >/dev/null; }

# The GPT-2 fixture's vocabulary size: one past its largest id.
vocab=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(1 + max(list(j["model"]["vocab"].values()) + [t["id"] for t in j["added_tokens"]]))' $FX/cli_gpt2.json)

# ---- ids, determinism over --jobs, the split --------------------------------
O=$DT_TMP/det; mkdir -p "$O"
for j in 1 2 3; do
  TK --tokenizer $FX/cli_gpt2.json "${INPUTS[@]}" -o "$O/j$j" --jobs $j --val-tokens 1000 --shard-tokens 3000 \
     --piece-bytes 512 >"$O/out$j" 2>&1 || fail "tokenize --jobs $j" "$(tail -3 "$O/out$j")"
done
TK --tokenizer $FX/cli_gpt2.json "${INPUTS[@]}" -o "$O/big" --jobs 2 --val-tokens 1000 --shard-tokens 3000 \
   >/dev/null 2>&1 || fail "tokenize with the default piece size"
same=1
for f in "$O"/j1_*.bin; do
  b=$(basename "$f"); b=${b#j1}
  for x in j2 j3 big; do cmp -s "$f" "$O/$x$b" || same=0; done
done
n1=$(ls "$O"/j1_*.bin | wc -l); n3=$(ls "$O"/j3_*.bin | wc -l)
[ $same = 1 ] && [ "$n1" = "$n3" ] && [ "$n1" -ge 3 ] && pass "--jobs 1, 2, 3 (and other piece sizes) write the same bytes ($n1 shards)" \
  || fail "same bytes whatever --jobs" "same=$same n1=$n1 n3=$n3"
shards "$O"/j1_val_000000.bin $(ls "$O"/j1_train_*.bin | sort) > "$O/read" || fail "shards parse"
ids=$(tail -1 "$O/read"); want=$(expected cli_gpt2)
[ -n "$want" ] && [ "$ids" = "$want" ] && pass "ids equal tokenizers' (GPT-2 split; text, jsonl, empty docs, 512-byte pieces)" \
  || fail "ids equal tokenizers' (GPT-2 split)" "got $(echo "$ids" | cut -c1-80) want $(echo "$want" | cut -c1-80)"
python3 - "$O/read" <<'PY' && pass "val holds the first 1000 tokens; train shards 3000 each, the last shorter; uint16 v1 headers" \
  || fail "val/train split and headers"
import sys
rows = [l.split() for l in open(sys.argv[1]).read().splitlines()[:-1]]
assert all(r[:3] == ["20240520", "1", "2"] for r in rows), rows
counts = [int(r[3]) for r in rows]
assert counts[0] == 1000 and all(c == 3000 for c in counts[1:-1]) and 0 < counts[-1] <= 3000, counts
PY
grep -q "^tokenize: 15 documents (and empty ones skipped), .* uint16 shard(s) (vocab $vocab) .* 3 jobs" "$O/out3" \
  && pass "one summary line (documents, tokens, shards, jobs)" || fail "summary line" "$(cat "$O/out3")"

# ---- Llama 3's split, BOS as the document token -----------------------------
TK --tokenizer $FX/cli_llama.json "${INPUTS[@]}" -o "$DT_TMP/ll" --piece-bytes 700 --jobs 2 >/dev/null 2>&1
ids=$(shards $(ls "$DT_TMP"/ll_train_*.bin | sort) 2>/dev/null | tail -1); want=$(expected cli_llama)
[ -n "$want" ] && [ "$ids" = "$want" ] && pass "ids equal tokenizers' (Llama 3 split, <|begin_of_text|> between documents)" \
  || fail "ids equal tokenizers' (Llama 3 split)" "got $(echo "$ids" | cut -c1-80)"

# ---- the tokenizer library's fixtures (tests/fixtures/tok/<kind>/: docs.jsonl and
# tokenizers' ids per line) through dtrun tokenize: GPT-2, Llama 3, Qwen2, Mistral
for kind in gpt2 llama3 qwen2 mistral; do
  d=$FX/$kind
  [ -f "$d/ids.txt" ] || { skip "$kind fixture" "no $d/ids.txt"; continue; }
  TK --tokenizer "$d" "$d/docs.jsonl" -o "$DT_TMP/fx_$kind" --jobs 2 >"$DT_TMP/fx_$kind.out" 2>&1
  if shards "$DT_TMP/fx_$kind"_train_000000.bin 2>/dev/null | tail -1 | python3 -c '
import json, sys
d = sys.argv[1]
tok = json.load(open(d + "/tokenizer.json"))
ids = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
sep = next(ids[t] for t in ("<|endoftext|>", "<|begin_of_text|>", "<s>") if t in ids)
want = []
for line, doc in zip(open(d + "/ids.txt"), open(d + "/docs.jsonl")):
    if json.loads(doc)["text"]:
        want += [sep] + [int(x) for x in line.split()]
got = [int(x) for x in sys.stdin.read().split()]
sys.exit(got != want)' "$d"; then pass "$kind fixture: every document's ids through dtrun tokenize"
  else fail "$kind fixture through dtrun tokenize" "$(tail -2 "$DT_TMP/fx_$kind.out")"; fi
done

# ---- uint32 shards: a vocabulary with id 70000 ------------------------------
TK --tokenizer $FX/cli_u32.json "${INPUTS[@]}" -o "$DT_TMP/u32" --jobs 3 --shard-tokens 5000 >/dev/null 2>&1
shards $(ls "$DT_TMP"/u32_train_*.bin | sort) > "$DT_TMP/u32.read" 2>/dev/null
if [ "$(tail -1 "$DT_TMP/u32.read")" = "$(expected cli_u32)" ] && head -1 "$DT_TMP/u32.read" | grep -q "^20240801 7 4 5000$"; then
  pass "ids above 65535 in the vocabulary: uint32 shards (magic 20240801 version 7), same ids"
else fail "uint32 shards" "$(head -2 "$DT_TMP/u32.read" | cut -c1-100)"; fi
printf 'x <|big|> y' | TK --tokenizer $FX/cli_u32.json - -o "$DT_TMP/big32" --jobs 1 >/dev/null 2>&1
shards "$DT_TMP/big32_train_000000.bin" 2>/dev/null | tail -1 | grep -qw 70000 \
  && [ "$(TK --decode "$DT_TMP/big32_train_000000.bin" --tokenizer $FX/cli_u32.json)" = "<|endoftext|>x <|big|> y" ] \
  && pass "stdin is one document; id 70000 stored and decoded back" || fail "id 70000 through a uint32 shard"
TK --tokenizer $FX/cli_u32.json $DOCS/a.txt -o "$DT_TMP/dt" --doc-token '<|big|>' >/dev/null 2>&1
TK --tokenizer $FX/cli_u32.json $DOCS/a.txt -o "$DT_TMP/di" --doc-token 70000 >/dev/null 2>&1
[ "$(shards "$DT_TMP/dt_train_000000.bin" 2>/dev/null | tail -1 | cut -d' ' -f1)" = 70000 ] \
  && cmp -s "$DT_TMP/dt_train_000000.bin" "$DT_TMP/di_train_000000.bin" \
  && pass "--doc-token as a string or an id" || fail "--doc-token"

# ---- --decode ----------------------------------------------------------------
TK --tokenizer $FX/cli_gpt2.json $DOCS/a.txt $DOCS/b.txt -o "$DT_TMP/rt" >/dev/null 2>&1
{ printf '<|endoftext|>'; cat $DOCS/a.txt; printf '<|endoftext|>'; cat $DOCS/b.txt; } > "$DT_TMP/rt.want"
TK --decode "$DT_TMP/rt_train_000000.bin" --tokenizer $FX/cli_gpt2.json > "$DT_TMP/rt.got" 2>&1
cmp -s "$DT_TMP/rt.want" "$DT_TMP/rt.got" && [ "$(TK --decode "$DT_TMP/rt_train_000000.bin" --tokenizer $FX/cli_gpt2.json --count 1)" = "<|endoftext|>" ] \
  && pass "--decode gives the documents back (uint16), --count N the first N" || fail "--decode round trip" "$(head -c 200 "$DT_TMP/rt.got")"

# ---- bad input: exit 2, a message naming it, nothing written -----------------
B=$DT_TMP/bad; mkdir -p "$B"
expect2() { # name pattern args...   (output prefix $B/out)
  local name=$1 pat=$2; shift 2
  TK "$@" >"$B/err" 2>&1; local rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$pat" "$B/err" && no_files "$B/out"; then pass "$name"
  else fail "$name" "rc=$rc: $(head -3 "$B/err")"; fi
}
printf '{"text": "ok"}\n{"text": "fine"}\n{"txt": "no field"}\n' > "$B/nofield.jsonl"
printf '{"text": "ok"}\n{"text": "unterminated\n' > "$B/notjson.jsonl"
printf '{\n  "version": "1.0",\n  "model": {"type": "BPE", \n' > "$B/broken.json"
sed 's/<|endoftext|>/<|sep|>/g' $FX/cli_gpt2.json > "$B/nodoc.json"
: > "$B/empty.txt"; : > "$B/empty.jsonl"
expect2 "missing tokenizer named" "nope.json" --tokenizer "$B/nope.json" $DOCS/a.txt -o "$B/out"
expect2 "malformed tokenizer.json named" "broken.json" --tokenizer "$B/broken.json" $DOCS/a.txt -o "$B/out"
expect2 "missing input named" "missing.txt" --tokenizer $FX/cli_gpt2.json $DOCS/a.txt "$B/missing.txt" -o "$B/out"
expect2 "empty input is an error" "no text" --tokenizer $FX/cli_gpt2.json "$B/empty.txt" "$B/empty.jsonl" -o "$B/out"
expect2 "jsonl line without the field: file:line" "nofield.jsonl:3: no field \"text\"" --tokenizer $FX/cli_gpt2.json $DOCS/a.txt "$B/nofield.jsonl" -o "$B/out"
expect2 "jsonl line that is not JSON: file:line" "notjson.jsonl:2: not a JSON line" --tokenizer $FX/cli_gpt2.json "$B/notjson.jsonl" -o "$B/out"
printf '{"text": "ok", "id": "a\\u0000"}\n{"text": "a\\\\u0000 is text"}\n{"text": "cut\\u0000 here"}\n' > "$B/nul.jsonl"
expect2 "jsonl text holding \\u0000: file:line (not cut silently)" 'nul.jsonl:3: field "text" holds a \\u0000' \
  --tokenizer $FX/cli_gpt2.json "$B/nul.jsonl" -o "$B/out"
expect2 "--field picks the key" "c.jsonl:1: no field \"body\"" --tokenizer $FX/cli_gpt2.json $DOCS/c.jsonl --field body -o "$B/out"
expect2 "unwritable output folder" "cannot write" --tokenizer $FX/cli_gpt2.json $DOCS/a.txt -o "$B/no/such/dir/out"
[ "$(id -u)" = 0 ] || { mkdir -p "$B/ro"; chmod 555 "$B/ro"; expect2 "read-only output folder" "cannot write" --tokenizer $FX/cli_gpt2.json $DOCS/a.txt -o "$B/ro/out"; }
expect2 "--shard-tokens not a number: flag named" "shard-tokens" --tokenizer $FX/cli_gpt2.json $DOCS/a.txt -o "$B/out" --shard-tokens lots
expect2 "--jobs 0: flag named" "jobs" --tokenizer $FX/cli_gpt2.json $DOCS/a.txt -o "$B/out" --jobs 0
expect2 "--val-tokens negative: flag named" "val-tokens" --tokenizer $FX/cli_gpt2.json $DOCS/a.txt -o "$B/out" --val-tokens -5
expect2 "unknown flag named" "unknown flag.*--shards" --tokenizer $FX/cli_gpt2.json $DOCS/a.txt -o "$B/out" --shards 3
expect2 "no -o" "-o PREFIX" --tokenizer $FX/cli_gpt2.json $DOCS/a.txt
expect2 "--val-tokens past the input" "no tokens left for training" --tokenizer $FX/cli_gpt2.json $DOCS/b.txt -o "$B/out" --val-tokens 100K
expect2 "--format xml: flag named" "format wants text, jsonl or auto" --tokenizer $FX/cli_gpt2.json $DOCS/a.txt -o "$B/out" --format xml
printf '{"text": "ok"}\n{"text": "fine"}\n{"txt": "no field"}\n' | TK --tokenizer $FX/cli_gpt2.json --format jsonl - -o "$B/out" \
  >"$B/err" 2>&1; rc=$?
[ $rc = 2 ] && grep -q 'stdin:3: no field "text"' "$B/err" && no_files "$B/out" \
  && pass "jsonl on stdin without the field: stdin:line, nothing written" || fail "jsonl stdin error" "rc=$rc $(head -2 "$B/err")"
expect2 "unknown --doc-token" "not a token" --tokenizer $FX/cli_gpt2.json $DOCS/a.txt -o "$B/out" --doc-token '<|nope|>'
expect2 "no document token: asks for --doc-token" "give --doc-token" --tokenizer "$B/nodoc.json" $DOCS/a.txt -o "$B/out"
TK --tokenizer "$B/nodoc.json" $DOCS/a.txt -o "$B/sep" --doc-token '<|sep|>' >/dev/null 2>&1 \
  && [ "$(TK --decode "$B/sep_train_000000.bin" --tokenizer "$B/nodoc.json" --count 1)" = "<|sep|>" ] \
  && pass "--doc-token supplies the missing separator" || fail "--doc-token on a tokenizer without one"
expect2 "--decode of a file that is not a shard" "not a token shard" --decode $DOCS/a.txt --tokenizer $FX/cli_gpt2.json

# Existing shards: refused without --force; --force replaces them and removes the
# older run's extra shards.
P=$DT_TMP/ex/p; mkdir -p "$DT_TMP/ex"
TK --tokenizer $FX/cli_gpt2.json $DOCS/big.txt -o "$P" --shard-tokens 1000 >/dev/null 2>&1
n_before=$(ls "$P"_train_*.bin | wc -l); sum_before=$(cat "$P"_train_*.bin | md5sum)
TK --tokenizer $FX/cli_gpt2.json $DOCS/a.txt -o "$P" >"$B/err" 2>&1; rc=$?
[ $rc = 2 ] && grep -q -- "--force" "$B/err" && [ "$(cat "$P"_train_*.bin | md5sum)" = "$sum_before" ] \
  && pass "existing shards are not overwritten without --force" || fail "existing shards refused" "rc=$rc $(cat "$B/err")"
TK --tokenizer $FX/cli_gpt2.json $DOCS/a.txt -o "$P" --force >/dev/null 2>&1
[ "$n_before" -gt 1 ] && [ "$(ls "$P"_*.bin)" = "${P}_train_000000.bin" ] \
  && pass "--force replaces them ($n_before older shards -> 1)" || fail "--force" "$(ls "$DT_TMP/ex")"

# ---- signals: no partial shard, no temporary --------------------------------
for i in $(seq 1 400); do cat $DOCS/big.txt; done > "$DT_TMP/large.txt"   # ~9 MB
# held_run DIR: starts dtrun tokenize on large.txt through stdin from a FIFO whose
# writer stays open, so the run cannot finish however fast the machine is: it
# writes shards (temporaries) and then waits for more input. Sets $pid (dtrun's)
# and $feeder; held_end closes the writer's end.
held_run() {
  mkfifo "$1/in"
  "$DTRUN" tokenize --tokenizer $FX/cli_gpt2.json - -o "$1/s" --jobs 1 --shard-tokens 20000 <"$1/in" >"$1/log" 2>&1 &
  pid=$!
  exec 7>"$1/in"
  cat "$DT_TMP/large.txt" >&7 2>/dev/null & feeder=$!
}
held_end() { kill $feeder 2>/dev/null; wait $feeder 2>/dev/null; exec 7>&-; }
for sig in INT TERM; do
  S=$DT_TMP/sig$sig; mkdir -p "$S"
  held_run "$S"
  for t in $(seq 1 500); do compgen -G "$S/s_train_*.tmp.*" >/dev/null && break; sleep 0.02; done
  kill -$sig $pid; wait $pid; rc=$?
  held_end; rm -f "$S/in"
  want=$((128 + $(kill -l $sig)))
  if [ $rc = 0 ]; then skip "SIG$sig mid-run" "the run finished before the signal"
  elif [ $rc = $want ] && no_files "$S/s" && grep -q "no shard written" "$S/log"; then
    pass "SIG$sig mid-run: exit $want, no shard and no temporary left"
  else fail "SIG$sig mid-run" "rc=$rc files: $(ls "$S" | head -3)"; fi
done
# SIGKILL cannot be caught: its temporaries stay, and the next run of the prefix
# removes them (their pid is gone) and says so; a live run's are left alone.
S=$DT_TMP/sigKILL; mkdir -p "$S"
held_run "$S"
for t in $(seq 1 500); do compgen -G "$S/s_train_*.tmp.*" >/dev/null && break; sleep 0.02; done
kill -KILL $pid; wait $pid 2>/dev/null
held_end; rm -f "$S/in" "$S/log"
n_stale=$(ls "$S" | grep -c "\.tmp\.$pid$")
sleep 60 & live=$!
touch "$S/s_train_000000.bin.tmp.$live"
TK --tokenizer $FX/cli_gpt2.json $DOCS/a.txt -o "$S/s" >"$S/log" 2>&1; rc=$?
if [ "$n_stale" -ge 1 ] && [ $rc = 0 ] && ! ls "$S" | grep -q "\.tmp\.$pid$" && [ -e "$S/s_train_000000.bin.tmp.$live" ] &&
   grep -q "removed $n_stale temporary file(s) of .*s_\* left by a killed run" "$S/log"; then
  pass "SIGKILL's $n_stale temporaries are removed by the next run of the prefix (a live run's are kept)"
else fail "stale temporaries" "n_stale=$n_stale rc=$rc $(ls "$S" | head -5) $(cat "$S/log")"; fi
kill $live 2>/dev/null; wait $live 2>/dev/null
(sleep 3; echo late) | { "$DTRUN" tokenize --tokenizer $FX/cli_gpt2.json - -o "$DT_TMP/sigstdin" >/dev/null 2>&1 & pid=$!;
  sleep 0.5; kill -INT $pid; wait $pid; echo $? > "$DT_TMP/stdin.rc"; } &
waiter=$!
for t in $(seq 1 100); do [ -s "$DT_TMP/stdin.rc" ] && break; sleep 0.1; done
[ "$(cat "$DT_TMP/stdin.rc" 2>/dev/null)" = 130 ] && no_files "$DT_TMP/sigstdin" \
  && pass "SIGINT while waiting on stdin ends the run at once (exit 130)" || fail "SIGINT on stdin" "rc=$(cat "$DT_TMP/stdin.rc" 2>/dev/null)"
wait $waiter 2>/dev/null

# ---- progress: a live line on a terminal, one summary line otherwise --------
# DTRUN_PROGRESS_MS=0 redraws at every pass of the writer (after each piece), so
# the line is there however fast the machine encodes large.txt (at the default
# 100 ms a fast machine finished before the first redraw); the ETA is a number
# once a piece is written.
DTRUN_PROGRESS_TTY=1 DTRUN_PROGRESS_MS=0 TK --tokenizer $FX/cli_gpt2.json "$DT_TMP/large.txt" -o "$DT_TMP/pr" --jobs 1 >"$DT_TMP/pr.out" 2>"$DT_TMP/pr.err"
if grep -q $'\r''tokenize: .*B / .*B (.*%) .* tokens/s  ETA [0-9][0-9]* s' "$DT_TMP/pr.err" && [ "$(wc -l < "$DT_TMP/pr.out")" = 1 ]; then
  pass "live progress line (bytes, tokens/s, ETA) on a terminal"; else fail "live progress line" "$(head -c 300 "$DT_TMP/pr.err")"; fi
DTRUN_PROGRESS_MS=soon TK --tokenizer $FX/cli_gpt2.json $DOCS/a.txt -o "$DT_TMP/bp" >/dev/null 2>"$DT_TMP/badms.err"; rc=$?
[ $rc = 2 ] && grep -q "DTRUN_PROGRESS_MS=soon: expected milliseconds" "$DT_TMP/badms.err" && no_files "$DT_TMP/bp" \
  && pass "a bad DTRUN_PROGRESS_MS: exit 2 naming it, nothing written" || fail "bad DTRUN_PROGRESS_MS" "rc=$rc $(cat "$DT_TMP/badms.err")"
TK --tokenizer $FX/cli_gpt2.json $DOCS/a.txt -o "$DT_TMP/np" >"$DT_TMP/np.out" 2>"$DT_TMP/np.err"
[ ! -s "$DT_TMP/np.err" ] && [ "$(wc -l < "$DT_TMP/np.out")" = 1 ] && ! grep -q $'\r' "$DT_TMP/np.out" \
  && pass "no terminal: one summary line, no carriage return" || fail "summary only off a terminal"

# ---- invalid UTF-8: a warning with the count and the first offset -----------
printf 'ok \xff\xfe then fine' > "$DT_TMP/bad8.txt"
TK --tokenizer $FX/cli_gpt2.json "$DT_TMP/bad8.txt" -o "$DT_TMP/b8" >/dev/null 2>"$DT_TMP/b8.err"
grep -q "warning: 2 byte(s) of invalid UTF-8, the first at .*bad8.txt:offset 3" "$DT_TMP/b8.err" \
  && pass "invalid UTF-8: warning with the count and file:offset, still encoded" || fail "invalid UTF-8 warning" "$(cat "$DT_TMP/b8.err")"

# ---- stdin is streamed --------------------------------------------------------
# Through a pipe, in pieces of its own (cut at cut points / line ends): the same
# bytes as the files, and a 48 MB stream never held whole (peak RSS far below it).
S=$DT_TMP/stdin; mkdir -p "$S"
TK --tokenizer $FX/cli_gpt2.json $DOCS/big.txt -o "$S/f" --jobs 1 >/dev/null 2>&1
cat $DOCS/big.txt | TK --tokenizer $FX/cli_gpt2.json - -o "$S/p" --jobs 2 --piece-bytes 600 >/dev/null 2>&1
TK --tokenizer $FX/cli_gpt2.json $DOCS/c.jsonl -o "$S/jf" --jobs 1 >/dev/null 2>&1
cat $DOCS/c.jsonl | TK --tokenizer $FX/cli_gpt2.json --format jsonl - -o "$S/jp" --jobs 2 --piece-bytes 200 >/dev/null 2>&1
cmp -s "$S/f_train_000000.bin" "$S/p_train_000000.bin" && cmp -s "$S/jf_train_000000.bin" "$S/jp_train_000000.bin" \
  && pass "stdin (text, and jsonl with --format jsonl) in small pieces: the same bytes as the files" \
  || fail "stdin streamed equals the file" "$(ls -la "$S")"
if [ "${SAN:-0}" = 1 ] || [[ "$DTRUN" == *-san ]]; then
  skip "a 48 MB stream through stdin in bounded memory" "SAN=1 (the sanitizers' shadow memory and quarantine set RSS)"
elif python3 - "$DTRUN" $FX/cli_gpt2.json "$S/big" <<'PY'; then
import resource, subprocess, sys
dtrun, tok, out = sys.argv[1:]
line = b"the quick brown fox jumps over a lazy dog, 12 times.\n"
p = subprocess.Popen([dtrun, "tokenize", "--tokenizer", tok, "-", "-o", out, "--jobs", "2"], stdin=subprocess.PIPE,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
total = 0
while total < 48 << 20:
    p.stdin.write(line * 20000)
    total += len(line) * 20000
p.stdin.close()
assert p.wait() == 0
rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print("48 MB through stdin: peak RSS %.1f MB" % rss_mb)
assert rss_mb < 32, rss_mb
PY
  pass "a 48 MB stream through stdin: peak RSS under 32 MB (streamed, not read whole)"
else fail "stdin streamed with bounded memory"; fi
rm -rf "$S"

# ---- the README flow: tokenize, then train a tiny GPT on the shards ---------
R=$DT_TMP/readme; mkdir -p "$R"
TK --tokenizer $FX/cli_gpt2.json $DOCS/a.txt $DOCS/big.txt $DOCS/c.jsonl -o "$R/tok" --val-tokens 500 >/dev/null 2>&1
cat > "$R/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": $vocab},
 "data": {"train": "$R/tok_train_*.bin", "val": "$R/tok_val_*.bin"},
 "train_micro_batch_size_per_gpu": 8, "train_steps": 60, "steps_per_print": 10,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
 "eval": {"every_steps": 0}, "threads": 1, "seed": 3,
 "checkpoint": {"every_steps": 60, "resume": "never", "dir": "$R/ck"}, "log": {"dir": "$R/run"}}
JSON
if "$DTRUN" --standalone --nproc_per_node 1 "$R/gpt.json" >"$R/out" 2>&1 && python3 - "$R/run/metrics.jsonl" "$vocab" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
first, last = rows[0]["loss"], rows[-1]["loss"]
assert abs(first - math.log(int(sys.argv[2]))) < 0.3, first
assert last < first - 1.0, (first, last)
PY
then pass "README flow: tokenize, then a GPT (vocab $vocab) trains on the shards and its loss falls"
else fail "README flow: train on the shards" "$(tail -3 "$R/out")"; fi

# ---- dtrun sample --tokenizer on that checkpoint ------------------------------
# The text prompt is the ids dtrun tokenize writes for it (document token first),
# and the printed text is the prompt plus the decode of the generated ids.
printf 'The cat' > "$R/prompt.txt"
TK --tokenizer $FX/cli_gpt2.json "$R/prompt.txt" -o "$R/p" >/dev/null 2>&1
pids=$(shards "$R/p_train_000000.bin" 2>/dev/null | tail -1 | tr ' ' ,)
S() { "$DTRUN" sample "$R/ck" --tokens 12 --temperature 0 "$@" 2>>"$R/sample.err"; }
a=$(S --tokenizer $FX/cli_gpt2.json --prompt 'The cat' --ids); b=$(S --prompt-ids "$pids" --ids)
text=$(S --tokenizer $FX/cli_gpt2.json --prompt 'The cat')
python3 - "$R/gen_train_000000.bin" "$a" <<'PY'
import struct, sys
ids = [int(x) for x in sys.argv[2].split(",")]
hdr = struct.pack("<3i", 20240520, 1, len(ids)) + bytes(1012)
open(sys.argv[1], "wb").write(hdr + struct.pack("<%dH" % len(ids), *ids))
PY
dec=$(TK --decode "$R/gen_train_000000.bin" --tokenizer $FX/cli_gpt2.json)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$(echo "$pids" | cut -d, -f1)" = 0 ] && [ "$text" = "The cat$dec" ] \
  && pass "sample --tokenizer: the text prompt is its tokenize ids ($pids), the output the prompt + the decoded ids" \
  || fail "sample --tokenizer" "a=$a b=$b pids=$pids text=$text dec=$dec $(tail -2 "$R/sample.err")"
"$DTRUN" sample "$R/ck" --tokenizer $FX/cli_u32.json --prompt x >/dev/null 2>"$R/u32.err"; rc=$?
[ $rc = 2 ] && grep -q "not the model's tokenizer" "$R/u32.err" \
  && pass "sample --tokenizer with more ids than the model's vocabulary: exit 2, said so" \
  || fail "sample with a bigger tokenizer" "rc=$rc $(cat "$R/u32.err")"
finish
