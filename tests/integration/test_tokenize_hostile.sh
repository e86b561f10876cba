#!/usr/bin/env bash
# test_tokenize_hostile.sh - `dtrun tokenize` and `dtrun sample` on hostile input
# (issue 31), on real processes: a tokenizer.json with a huge id or an empty
# pattern is exit 2 naming the file and key (no allocation, no endless loop); a
# signal ends a run busy encoding one long piece at once; a pipe of text without
# newlines or spaces is cut exactly between letters and read in bounded memory.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
FX=tests/fixtures/tok
TK() { "$DTRUN" tokenize "$@"; }
no_files() { ! compgen -G "$1*" >/dev/null; }

# ---- hostile tokenizer.json: exit 2 at once, naming file, key, token, id -----
H=$DT_TMP/h; mkdir -p "$H"
python3 - "$FX/cli_gpt2.json" "$H" <<'PY'
import json, sys
base, out = json.load(open(sys.argv[1])), sys.argv[2]
def put(name, edit):
    j = json.loads(json.dumps(base)); edit(j); json.dump(j, open(f"{out}/{name}.json", "w"))
put("vocab_id", lambda j: j["model"]["vocab"].__setitem__("zzhuge", 2**31 - 1))
put("added_id", lambda j: j["added_tokens"].append({"id": 2**31 - 1, "content": "<|huge|>", "special": True}))
put("meta_empty", lambda j: (j.__setitem__("pre_tokenizer", {"type": "Metaspace", "replacement": "", "prepend_scheme": "first"}),
                             j.__setitem__("decoder", None)))
put("replace_empty", lambda j: j.__setitem__("decoder", {"type": "Replace", "pattern": {"String": ""}, "content": " "}))
PY
hostile() { # name file pattern
  timeout -k 2 20 "$DTRUN" tokenize --tokenizer "$H/$2.json" $FX/cli_docs/a.txt -o "$H/out" >"$H/err" 2>&1; local rc=$?
  if [ $rc = 2 ] && grep -q -- "$H/$2.json" "$H/err" && grep -q -- "$3" "$H/err" && no_files "$H/out"; then pass "$1"
  else fail "$1" "rc=$rc: $(head -c 300 "$H/err")"; fi
}
hostile "vocab id 2^31-1: exit 2 naming file, token and id" vocab_id 'model.vocab: the id 2147483647 of "zzhuge" is too large'
hostile "added token id 2^31-1: exit 2 naming it" added_id 'added_tokens\[1\].id: the id 2147483647 of "<|huge|>" is too large'
hostile "Metaspace with an empty replacement: exit 2 (it looped forever)" meta_empty "pre_tokenizer.replacement: empty"
hostile "Replace decoder with an empty pattern: exit 2" replace_empty "decoder.pattern: empty"

# ---- signals while one long piece is being encoded ---------------------------
# "the" 8M times: no cut point anywhere, so the file is one piece, which takes
# seconds to encode; the signal must end the run within a second (main ran on
# for the whole encode: 36 s for 90 MB).
python3 -c 'import sys; sys.stdout.write("the" * (8 << 20))' > "$DT_TMP/the.txt"
for sig in INT TERM; do
  S=$DT_TMP/enc$sig; mkdir -p "$S"
  "$DTRUN" tokenize --tokenizer $FX/gpt2/tokenizer.json "$DT_TMP/the.txt" -o "$S/s" --jobs 1 >"$S/log" 2>&1 &
  pid=$!
  sleep 0.7
  t0=$(date +%s%N); kill -$sig $pid
  if gone 3 $pid; then ms=$(( ($(date +%s%N) - t0) / 1000000 )); else ms=timeout; kill -KILL $pid; fi
  wait $pid; rc=$?
  want=$((128 + $(kill -l $sig)))
  if [ $rc = 0 ]; then skip "SIG$sig while encoding one long piece" "the run finished before the signal"
  elif [ $rc = $want ] && [ "$ms" != timeout ] && no_files "$S/s" && grep -q "stopped by signal" "$S/log"; then
    pass "SIG$sig while encoding one long piece: exit $want in $ms ms, nothing written"
  else fail "SIG$sig while encoding one long piece" "rc=$rc after ${ms} ms: $(tail -2 "$S/log")"; fi
done
# `dtrun sample HF_DIR` reads the folder's own tokenizer.json: the same error.
cp -r tests/fixtures/hf/gpt2 "$H/hf"; cp "$H/vocab_id.json" "$H/hf/tokenizer.json"
timeout -k 2 20 "$DTRUN" sample "$H/hf" --prompt hi --tokens 2 >"$H/err" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "hf/tokenizer.json: model.vocab: the id 2147483647" "$H/err" \
  && pass "dtrun sample HF_DIR with that tokenizer.json: exit 2 naming it" || fail "sample HF_DIR hostile tokenizer" "rc=$rc $(head -c 300 "$H/err")"

# ---- a pipe without newlines or spaces: bounded memory, the same ids ---------
# peak KB of dtrun (ru_maxrss of the child) fed FILE through a pipe: prints "RC KB"
piped_rss() { # file args...
  python3 - "$DTRUN" "$@" <<'PY'
import resource, subprocess, sys
dtrun, src, args = sys.argv[1], sys.argv[2], sys.argv[3:]
p = subprocess.Popen([dtrun, "tokenize"] + args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                     stderr=open(args[args.index("-o") + 1] + ".err", "w"))
with open(src, "rb") as f:
    try:
        while True:
            b = f.read(1 << 20)
            if not b: break
            p.stdin.write(b)
    except BrokenPipeError:
        pass
try: p.stdin.close()
except BrokenPipeError: pass
rc = p.wait()
print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
PY
}
P=$DT_TMP/pipe; mkdir -p "$P"
python3 - "$P" <<'PY'
import random, sys
d = sys.argv[1]
random.seed(31)
cyr = "абвгдеёжзийклмнопрстуфхцчшщъыьэюя"
block = "".join(random.choices(cyr, k=1 << 19))
open(f"{d}/cyr.txt", "w").write(block * 24)                                          # 24 MB
mix = cyr + "abcdefghijklmnopqrstuvwxyzTHE'"
open(f"{d}/mix.txt", "w").write("".join(random.choices(mix, k=1 << 20)))
PY
read rc kb < <(piped_rss "$P/cyr.txt" --tokenizer $FX/gpt2/tokenizer.json - -o "$P/c" --jobs 2)
if [ "${SAN:-0}" = 1 ]; then skip "Cyrillic pipe in bounded memory" "SAN=1 (the sanitizers' shadow memory and quarantine set RSS)"
else [ "$rc" = 0 ] && [ "$kb" -lt 65536 ] && pass "24 MB of Cyrillic without a space or newline through a pipe: peak RSS $((kb / 1024)) MB (< 64 MB)" \
  || fail "Cyrillic pipe in bounded memory" "rc=$rc peak ${kb} KB: $(head -c 300 "$P/c.err")"; fi
for k in gpt2 llama3 mistral; do
  TK --tokenizer $FX/$k/tokenizer.json "$P/mix.txt" -o "$P/whole$k" --piece-bytes 1G --stats >"$P/w.out" 2>&1
  cat "$P/mix.txt" | TK --tokenizer $FX/$k/tokenizer.json - -o "$P/cut$k" --piece-bytes 64K --stats >"$P/c.out" 2>&1
  pieces=$(sed -n 's/^tokenize: \([0-9]*\) pieces.*/\1/p' "$P/c.out"); whole=$(sed -n 's/^tokenize: \([0-9]*\) pieces.*/\1/p' "$P/w.out")
  if [ "$whole" = 1 ] && [ "${pieces:-0}" -ge 8 ] && cmp -s "$P/whole${k}_train_000000.bin" "$P/cut${k}_train_000000.bin"; then
    pass "$k: stdin cut into $pieces pieces between letters gives the ids of the whole text at once"
  else fail "$k: letter cuts exact" "pieces=$pieces whole=$whole $(tail -1 "$P/c.out")"; fi
done
# A stretch where no cut is exact ("the" repeated: every cut could change the
# ids): refused past the 16 MiB bound, memory bounded, nothing written.
python3 -c 'import sys; sys.stdout.write("the" * (6 << 20))' > "$P/the.txt"
read rc kb < <(piped_rss "$P/the.txt" --tokenizer $FX/gpt2/tokenizer.json - -o "$P/t")
[ "$rc" = 2 ] && { [ "${SAN:-0}" = 1 ] || [ "$kb" -lt 131072 ]; } && grep -q "stdin: 16 MiB from byte 0 on without a point where the text can be cut" "$P/t.err" \
  && no_files "$P/t_" && pass "18 MB with no exact cut point on a pipe: exit 2 past 16 MiB, peak RSS $((kb / 1024)) MB, nothing written" \
  || fail "no cut point on a pipe" "rc=$rc peak ${kb} KB: $(head -c 300 "$P/t.err")"
finish
