#!/usr/bin/env bash
# test_tokenize_hostile.sh - `dtrun tokenize` and `dtrun sample` on hostile input
# (issue 31), on real processes: a tokenizer.json with a huge id or an empty
# pattern is exit 2 naming the file and key (no allocation, no endless loop); a
# signal ends a run busy encoding one long piece at once.
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
finish
