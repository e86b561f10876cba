#!/usr/bin/env bash
# test_data_mix.sh - a weighted mixture of two token-shard sources (one uint16, one
# uint32) with real dtrun processes: saved by 2 ranks, resumed by 1 and by 3 ranks,
# the losses equal an uninterrupted 1-rank run (within 1e-5) and the per-source
# positions in meta.json match; a source matching no file stops the launch before
# any worker starts.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."

make_text "$DT_TMP/a.txt" 1 1500
make_text "$DT_TMP/b.txt" 2 800
python3 - "$DT_TMP" <<'PY'
import struct, sys
d = sys.argv[1]
for name, width, magic, version in (("a", 2, 20240520, 1), ("b", 4, 20240801, 7)):
    toks = open(f"{d}/{name}.txt", "rb").read()
    hdr = struct.pack("<256i", magic, version, len(toks), *([0] * 253))
    body = b"".join(t.to_bytes(width, "little") for t in toks)
    open(f"{d}/{name}_000.bin", "wb").write(hdr + body)
PY
cat > "$DT_TMP/mix.json" <<JSON
{"model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 32, "seq_len": 16, "vocab_size": 256},
 "data": {"train": [{"path": "$DT_TMP/a_*.bin", "weight": 0.7}, {"path": "$DT_TMP/b_*.bin", "weight": 0.3}],
          "val_fraction": 0.05},
 "train_batch_size": 12, "train_micro_batch_size_per_gpu": 2, "train_steps": 12, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "eval": {"every_steps": 0}, "threads": 1, "seed": 7,
 "checkpoint": {"every_steps": 6, "resume": "auto"}}
JSON
run() { # name nproc args...
  local name=$1 n=$2; shift 2
  "$DTRUN" --nproc_per_node "$n" "$DT_TMP/mix.json" log.dir="$DT_TMP/log_$name" "$@" >"$DT_TMP/$name.out" 2>&1 ||
    fail "$name run" "$(tail -3 "$DT_TMP/$name.out")"
}
run one 1 checkpoint.dir="$DT_TMP/ck_one" data.prefetch=0
run two 2 checkpoint.dir="$DT_TMP/ck_two"
for n in 1 3; do
  mkdir -p "$DT_TMP/ck_r$n"; cp -r "$DT_TMP/ck_two/step_00000006" "$DT_TMP/ck_r$n/"; echo step_00000006 > "$DT_TMP/ck_r$n/latest"
  run r$n $n checkpoint.dir="$DT_TMP/ck_r$n" data.prefetch=3
  if grep -q "resumed from .*step_00000006" "$DT_TMP/r$n.out" &&
     python3 - "$DT_TMP/log_one/metrics.jsonl" "$DT_TMP/log_r$n/metrics.jsonl" <<'PY'; then
import json, sys
a = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[1])}
b = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[2])}
assert sorted(b) == list(range(7, 13)), sorted(b)
err = max(abs(a[s] - b[s]) / abs(a[s]) for s in b)
assert err < 1e-5, err
PY
    pass "mixture saved by 2 ranks, resumed by $n: losses equal the 1-rank run within 1e-5"
  else fail "mixture resume on $n rank(s)" "$(grep -i "resumed\|error" "$DT_TMP/r$n.out" | head -3)"; fi
done
if python3 - "$DT_TMP" <<'PY'; then
import json, sys
d = sys.argv[1]
def pos(ck, step):
    m = json.load(open(f"{d}/{ck}/step_{step:08d}/meta.json"))["data"]
    return m["samples"], [(s["path"], s["epoch"], s["cursor"]) for s in m["sources"]]
for step in (6, 12):
    ref = pos("ck_one", step)
    assert ref[0] == 12 * step, ref
    assert ref[1][0][1] * 10**6 + ref[1][0][2] > 0 and ref[1][1][2] > 0, ref  # both sources drawn
    assert pos("ck_two", step) == ref, (pos("ck_two", step), ref)
for ck in ("ck_r1", "ck_r3"):
    assert pos(ck, 12) == pos("ck_one", 12), (ck, pos(ck, 12))
a, b = [c for _, _, c in pos("ck_one", 12)[1]]
assert 0.5 < a / (a + b) < 0.9, (a, b)  # weights 0.7 / 0.3 of 144 samples (no epoch wrapped)
PY
  pass "per-source positions in meta.json: equal for 1, 2 (saved) and 1, 3 (resumed) ranks"
else fail "per-source positions in meta.json"; fi

# Errors before any worker starts: naming the source's key.
sed "s#$DT_TMP/b_\*.bin#$DT_TMP/nothing_*.bin#" "$DT_TMP/mix.json" > "$DT_TMP/bad.json"
"$DTRUN" --nproc_per_node 2 "$DT_TMP/bad.json" log.dir="$DT_TMP/log_bad" >"$DT_TMP/bad.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "data.train\[1\]: no file matches '$DT_TMP/nothing_\*.bin'" "$DT_TMP/bad.out" &&
   grep -q "nothing was started" "$DT_TMP/bad.out" && [ ! -e "$DT_TMP/log_bad" ]; then
  pass "a source matching no file: exit 2 naming data.train[1], before workers start"
else fail "source matching no file" "rc=$rc $(head -3 "$DT_TMP/bad.out")"; fi
sed "s#$DT_TMP/b_\*.bin#$DT_TMP/a.txt#" "$DT_TMP/mix.json" > "$DT_TMP/kind.json"
"$DTRUN" --nproc_per_node 1 "$DT_TMP/kind.json" >"$DT_TMP/kind.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "a_\*.bin' is token shards but '$DT_TMP/a.txt' is text" "$DT_TMP/kind.out"; then
  pass "text and shard sources: exit 2 naming both"
else fail "mixed kinds" "rc=$rc $(head -3 "$DT_TMP/kind.out")"; fi
python3 - "$DT_TMP" <<'PY'
import struct, sys
d = sys.argv[1]
open(f"{d}/w32.bin", "wb").write(struct.pack("<256i", 20240801, 7, 40, *([0] * 253)) + struct.pack("<40I", *range(70000, 70040)))
PY
"$DTRUN" --nproc_per_node 1 "$DT_TMP/mix.json" data.train="$DT_TMP/w32.bin" model.vocab_size=0 >"$DT_TMP/w32.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "w32.bin' holds uint32 token shards .*set model.vocab_size" "$DT_TMP/w32.out"; then
  pass "uint32 shards without model.vocab_size: exit 2 asking for it"
else fail "uint32 without vocab" "rc=$rc $(head -3 "$DT_TMP/w32.out")"; fi
finish
