#!/usr/bin/env bash
# test_dp.sh - data parallelism as users run it, through the real launcher:
# N ranks with micro-batch B and accumulation A train exactly as 1 rank with
# accumulation N*A (losses and final parameters within 1e-5 relative after 20
# steps) for ddp, zero1, zero2, fsdp and hsdp, on an MLP whose parameter count N
# does not divide and on a tiny GPT over text; every rank's model-state bytes
# in summary.json equal the strategy's formula; reductions start from the
# backward hooks and FSDP prefetches (summary.json "overlap" counts); overlap
# off gives the same result; a rank with another seed is refused.
# Final parameters come from the hidden facility DTRUN_DUMP_PARAMS=PATH (rank 0
# writes the gathered fp32 parameters raw).
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
T="timeout -k 2 60"

make_text "$DT_TMP/text.txt" 1 3000
# GPT: 34,688 parameters (not divisible by 3); MLP 16-33-33-4: 1,819 (odd).
cat > "$DT_TMP/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 2, "train_steps": 20, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "zero_optimization": {"reduce_bucket_size": 6000},
 "eval": {"every_steps": 0}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
MLP="configs/mlp-tiny.json optimizer.params.weight_decay=0.1 eval.every_steps=0 steps_per_print=1"

# run NAME NPROC CONFIG ARGS...: trains, dumps parameters to $DT_TMP/NAME.bin, log in $DT_TMP/NAME
run() {
  local name=$1 np=$2; shift 2
  DTRUN_DUMP_PARAMS="$DT_TMP/$name.bin" $T "$DTRUN" --standalone --nproc_per_node "$np" "$@" \
    log.dir="$DT_TMP/$name" >"$DT_TMP/$name.out" 2>&1
}
# same NAME REF: losses and final parameters within 1e-5 relative (see below)
same() {
  python3 - "$DT_TMP/$1" "$DT_TMP/$2" <<'PY'
import json, sys, numpy as np
a, b = sys.argv[1], sys.argv[2]
la = [json.loads(l)["loss"] for l in open(a + "/metrics.jsonl")]
lb = [json.loads(l)["loss"] for l in open(b + "/metrics.jsonl")]
assert len(la) == len(lb) == 20, (len(la), len(lb))
dl = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
pa, pb = np.fromfile(a + ".bin", np.float32), np.fromfile(b + ".bin", np.float32)
assert pa.size == pb.size, (pa.size, pb.size)
# Relative error of the parameter vector (L2). Elementwise it is looser: the
# attention key bias has an exactly zero true gradient (softmax ignores a
# constant added to every key), so Adam turns its rounding noise into steps of
# lr size that differ between summation orders.
dp = float(np.linalg.norm(pa - pb) / np.linalg.norm(pb))
dmax = float(np.abs(pa - pb).max() / np.abs(pb).max())
assert dl < 1e-5 and dp < 1e-5 and dmax < 1e-4, ("loss", dl, "params", dp, "max", dmax)
PY
}
# mem NAME STRATEGY: every rank's model-state bytes equal the formula (CPU fp32,
# Ψp the padded count: ddp 16Ψ, zero1 8Ψp+8Ψp/N, zero2 4Ψp+12Ψp/N, fsdp 16Ψp/N)
mem() {
  python3 - "$DT_TMP/$1/summary.json" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); st = sys.argv[2]
n, P, Pp, W = s["n_params"], s["n_params"], s["padded_params"], s["world_size"]
N = s["n_shards"]
assert 0 <= Pp - P < s["n_buckets"] * N, (P, Pp)
want = {"ddp": 16 * P, "zero1": 8 * Pp + 8 * Pp // N, "zero2": 4 * Pp + 12 * Pp // N,
        "fsdp": 16 * Pp // N, "hsdp": 16 * Pp // N}[st]
assert len(s["ranks"]) == W, len(s["ranks"])
for r in s["ranks"]:
    ms = r["model_state_bytes"]
    assert ms["total"] == want == ms["expected"], (r["rank"], ms, want)
    assert r["peak_bytes"] >= ms["total"] + r["activation_bytes"]
PY
}

# overlap NAME on|off: summary.json's counts of what overlapped with compute
# (20 steps): every bucket's reduction launched from backward as the bucket
# completed, FSDP gathers mostly prefetched; with overlap off none of that.
overlap() {
  python3 - "$DT_TMP/$1/summary.json" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); o = s["overlap"]; n = s["n_buckets"] * s["steps"]
if sys.argv[2] == "on":
    assert o["reductions_in_backward"] == n and o["reductions_after"] == 0, o
    if s["strategy"] in ("fsdp", "hsdp"):
        assert o["gathers_prefetched"] > 2 * o["gathers_on_demand"] > 0, o
else:
    assert o["reductions_in_backward"] == 0 and o["reductions_after"] == n, o
    assert o["gathers_prefetched"] == 0, o
PY
}

# --- MLP, N=2, A=2 (Ψ odd) against 1 rank with A=4
run m1 1 $MLP model.hidden_dim=33 gradient_accumulation_steps=4 || fail "mlp reference" "$(tail -3 "$DT_TMP/m1.out")"
for s in ddp zero1 zero2 fsdp; do
  if run m2_$s 2 $MLP model.hidden_dim=33 gradient_accumulation_steps=2 strategy=$s && same m2_$s m1 && mem m2_$s $s; then
    pass "mlp $s: 2 ranks x A2 == 1 rank x A4 (odd parameter count), memory formula"
  else fail "mlp $s 2 ranks" "$(tail -3 "$DT_TMP/m2_$s.out")"; fi
done

# --- MLP, N=3, A=1 (1,732 parameters, not divisible by 3) against 1 rank with A=3
run m3ref 1 $MLP gradient_accumulation_steps=3 || fail "mlp reference A3"
for s in ddp zero1 zero2 fsdp; do
  if run m3_$s 3 $MLP strategy=$s && same m3_$s m3ref && mem m3_$s $s; then
    pass "mlp $s: 3 ranks == 1 rank x A3 (parameters not divisible by 3), memory formula"
  else fail "mlp $s 3 ranks" "$(tail -3 "$DT_TMP/m3_$s.out")"; fi
done

# --- MLP, N=4 (few and tiny: 2 cores)
run m4ref 1 $MLP gradient_accumulation_steps=4 train_micro_batch_size_per_gpu=2 || fail "mlp reference A4"
for s in ddp fsdp; do
  if run m4_$s 4 $MLP strategy=$s train_micro_batch_size_per_gpu=2 && same m4_$s m4ref && mem m4_$s $s; then
    pass "mlp $s: 4 ranks == 1 rank x A4, memory formula"
  else fail "mlp $s 4 ranks" "$(tail -3 "$DT_TMP/m4_$s.out")"; fi
done

# --- tiny GPT on text, N=2 with several buckets, against 1 rank with A=2
run g1 1 "$DT_TMP/gpt.json" gradient_accumulation_steps=2 || fail "gpt reference" "$(tail -3 "$DT_TMP/g1.out")"
for s in ddp zero1 zero2 fsdp; do
  if run g2_$s 2 "$DT_TMP/gpt.json" strategy=$s && same g2_$s g1 && mem g2_$s $s && overlap g2_$s on; then
    pass "gpt $s: 2 ranks == 1 rank x A2 (tied head, $(python3 -c "import json;print(json.load(open('$DT_TMP/g2_$s/summary.json'))['n_buckets'])") buckets), memory formula, reductions launched in backward"
  else fail "gpt $s 2 ranks" "$(tail -3 "$DT_TMP/g2_$s.out")"; fi
done
# strategies agree with each other directly, too
if same g2_fsdp g2_ddp && same g2_zero2 g2_zero1; then pass "gpt: fsdp == ddp, zero2 == zero1"; else fail "strategies agree"; fi
# overlap off: the same numbers
if run g2_off 2 "$DT_TMP/gpt.json" strategy=zero2 zero_optimization.overlap_comm=false && same g2_off g1 && overlap g2_off off \
   && run g3_off 3 "$DT_TMP/gpt.json" strategy=fsdp zero_optimization.overlap_comm=false train_micro_batch_size_per_gpu=1 gradient_accumulation_steps=2 \
   && run g3ref 1 "$DT_TMP/gpt.json" train_micro_batch_size_per_gpu=1 gradient_accumulation_steps=6 && same g3_off g3ref \
   && python3 -c "import json,sys; o=json.load(open('$DT_TMP/g3_off/summary.json'))['overlap']; sys.exit(o['gathers_prefetched'] != 0 or o['reductions_in_backward'] != 0)"; then
  pass "overlap_comm false: zero2 (2 ranks) and fsdp (3 ranks x A2) unchanged"
else fail "overlap off" "$(tail -3 "$DT_TMP/g3_off.out")"; fi

# --- hsdp on 2 nodes x 2 ranks (two agents on 127.0.0.2/3): shard in a node, replicate across
port=$(free_port)
for i in 1 0; do
  ( DTRUN_DUMP_PARAMS="$DT_TMP/h_hsdp.bin" $T "$DTRUN" --nnodes 2 --nproc_per_node 2 --rdzv_endpoint 127.0.0.2:$port \
      --local_addr 127.0.0.$((i + 2)) --rdzv_conf join_timeout=30 $MLP strategy=hsdp model.hidden_dim=33 \
      log.dir="$DT_TMP/h_hsdp" >"$DT_TMP/h$i.out" 2>&1; echo $? >"$DT_TMP/h$i.rc" ) &
done
wait
if [ "$(cat "$DT_TMP/h0.rc")$(cat "$DT_TMP/h1.rc")" = 00 ] && same h_hsdp m1 && mem h_hsdp hsdp \
   && python3 -c "import json,sys; s=json.load(open('$DT_TMP/h_hsdp/summary.json')); sys.exit(s['n_shards'] != 2)"; then
  pass "hsdp 2 nodes x 2: == 1 rank x A4, shards of 2 per node"
else fail "hsdp 2x2" "rc=$(cat "$DT_TMP"/h*.rc | tr -d '\n') $(tail -3 "$DT_TMP/h0.out")"; fi

# --- every rank must start from the same parameters: a rank with another seed is refused
cat > "$DT_TMP/seed.sh" <<SH
#!/bin/sh
exec "$DTRUN" __worker configs/mlp-tiny.json seed=\$((1 + RANK)) log.dir="$DT_TMP/seed"
SH
chmod +x "$DT_TMP/seed.sh"
$T "$DTRUN" --standalone --nproc_per_node 2 --exec "$DT_TMP/seed.sh" >"$DT_TMP/seed.out" 2>&1; rc=$?
if [ $rc -ne 0 ] && grep -q "initial parameters differ between rank 0" "$DT_TMP/seed.out"; then
  pass "different seeds on two ranks: refused, naming the ranks"
else fail "seed mismatch" "rc=$rc $(tail -3 "$DT_TMP/seed.out")"; fi

# DTRUN_DUMP_PARAMS never follows a symbolic link planted at its path: the run
# fails naming the path, and the link's target is untouched.
echo precious > "$DT_TMP/victim"
ln -s "$DT_TMP/victim" "$DT_TMP/dump_link"
DTRUN_DUMP_PARAMS="$DT_TMP/dump_link" $T "$DTRUN" --standalone --nproc_per_node 1 $MLP train_steps=1 \
  log.dir="$DT_TMP/dumplink" >"$DT_TMP/dumplink.out" 2>&1; rc=$?
if [ $rc -ne 0 ] && grep -q "DTRUN_DUMP_PARAMS: .*dump_link.*symbolic link" "$DT_TMP/dumplink.out" &&
   [ "$(cat "$DT_TMP/victim")" = precious ]; then
  pass "DTRUN_DUMP_PARAMS at a symbolic link: refused naming it, its target untouched"
else fail "DTRUN_DUMP_PARAMS symlink" "rc=$rc victim=$(head -c 20 "$DT_TMP/victim" | tr -cd '[:print:]') $(tail -3 "$DT_TMP/dumplink.out")"; fi
finish
