#!/usr/bin/env bash
# test_ckpt_meta.sh - a checkpoint whose meta.json holds an integer out of range
# (2^40 ranks, 2^31 layers, 1e309 as a data position) is refused by `dtrun export`
# and by a resume with exit 2 and an error naming meta.json, the field and the value,
# never exported or resumed with a truncated number ("saved by 0 rank(s)").
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."

make_text "$DT_TMP/text.txt" 1 4000
cat > "$DT_TMP/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 4, "train_steps": 2, "threads": 1, "seed": 5,
 "checkpoint": {"dir": "$DT_TMP/ck", "every_steps": 2},
 "log": {"dir": "$DT_TMP/run"}}
JSON
"$DTRUN" __worker "$DT_TMP/gpt.json" >"$DT_TMP/o" 2>&1 || fail "the first run" "$(tail -3 "$DT_TMP/o")"

# A copy of the checkpoint with meta.json's member PATH (a/b/0) set to the JSON text RAW.
edited() { # path raw
  rm -rf "$DT_TMP/bad"; cp -r "$DT_TMP/ck" "$DT_TMP/bad"
  python3 - "$DT_TMP/bad/step_00000002/meta.json" "$1" "$2" <<'PY'
import json, sys
p, path, raw = sys.argv[1:]
m = json.load(open(p)); o = m; keys = path.split("/")
for k in keys[:-1]: o = o[int(k)] if isinstance(o, list) else o[k]
o[keys[-1]] = "@RAW@"
open(p, "w").write(json.dumps(m).replace('"@RAW@"', raw))
PY
}
expect_refused() { # name pattern command...
  local name=$1 pat=$2; shift 2
  "$@" >"$DT_TMP/err" 2>&1; local rc=$?
  if [ $rc -eq 2 ] && grep -q "meta.json: $pat" "$DT_TMP/err" && ! grep -q "wrote" "$DT_TMP/err"; then pass "$name"
  else fail "$name" "rc=$rc: $(head -3 "$DT_TMP/err")"; fi
}

edited world_size 1099511627776
expect_refused "export: world_size 2^40 is refused, not shown as 0 ranks" \
  "'world_size' is 1099511627776, expected an integer from 1 to" \
  "$DTRUN" export "$DT_TMP/bad" -o "$DT_TMP/m.safetensors"
edited model/n_layer 2147483648
expect_refused "export: n_layer 2^31 is refused, not read as negative" \
  "'model.n_layer' is 2147483648, expected an integer from 1 to 1024" \
  "$DTRUN" export "$DT_TMP/bad" -o "$DT_TMP/m.safetensors"
edited model/n_layer '"1"'
expect_refused "sample: n_layer as a string is refused" "'model.n_layer' is the string \"1\"" \
  "$DTRUN" sample "$DT_TMP/bad" --tokens 2

# Resume from the edited checkpoint named explicitly: the data position 1e309.
edited data/cursor 1e309
sed "s#\"every_steps\": 2}#\"every_steps\": 2, \"resume\": \"$DT_TMP/bad/step_00000002\"}#; s#$DT_TMP/ck#$DT_TMP/ck2#; s#\"train_steps\": 2#\"train_steps\": 4#" \
  "$DT_TMP/gpt.json" > "$DT_TMP/resume.json"
expect_refused "resume: data.cursor 1e309 is refused" "'data.cursor' is a number out of range (not finite)" \
  "$DTRUN" __worker "$DT_TMP/resume.json"
finish
