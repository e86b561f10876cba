#!/usr/bin/env bash
# test_pp.sh - pipeline parallelism and 3D layouts through the real launcher,
# proven by equality: gpt at PP=2 and PP=4 with GPipe and 1F1B, and interleaved (PP=2 x 2
# chunks), train exactly as 1 rank with the same micro-batches (losses within 1e-5
# relative over 20 steps, final parameters within 1e-5 relative L2; gpt's head is tied to
# its embedding across the first and last stage); llama untied and tied the same;
# PP=2 x DP=2 with zero2 (interleaved, buckets as large as the model) and TP=2 x PP=2 x DP=2
# (8 ranks) with zero1 and with fsdp equal 1 rank with the same global batch, and so does
# TP=2 x PP=2 across two agents on loopback addresses (PP across the "nodes"); a
# checkpoint saved at TP=2 x PP=2 resumes at 1 rank and at PP=4 with the losses
# continuing within 1e-5, and exports with global shapes; the arenas each stage held are
# the schedule's (1F1B: P - s, +1 receiving ahead; GPipe: m) and its activation bytes
# that many arenas; the measured bubble of GPipe and 1F1B at P=4, m=4 and 16 is within 4
# points of (P-1)/(m+P-1) on balanced stages (DTRUN_PP_TEST_DELAY_MS); bad layouts are
# exit 2 before anything starts; a stopped stage makes its neighbour's receive time out
# naming the op, the peer and the sequence number.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
T="timeout -k 2 120"

make_text "$DT_TMP/text.txt" 1 3000
# 4 layers: PP=4 holds one each; 4 heads of 8: TP=2 holds two.
cat > "$DT_TMP/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "train_steps": 20, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "zero_optimization": {"reduce_bucket_size": 6000},
 "eval": {"every_steps": 10, "batches": 2}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
cat > "$DT_TMP/llama.json" <<JSON
{"model": {"type": "llama", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 64, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "train_steps": 20, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "eval": {"every_steps": 0}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON

# run NAME NPROC CONFIG ARGS...: trains, dumps the whole model's parameters to $DT_TMP/NAME.bin
run() {
  local name=$1 np=$2 cfg=$3; shift 3
  DTRUN_DUMP_PARAMS="$DT_TMP/$name.bin" $T "$DTRUN" --standalone --nproc_per_node "$np" \
    "$DT_TMP/$cfg.json" log.dir="$DT_TMP/$name" "$@" >"$DT_TMP/$name.out" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || echo "run $name: exit $rc: $(tail -5 "$DT_TMP/$name.out")"
  return $rc
}
# same NAME REF [TOL] [FIRST]: losses (and val losses) from step FIRST on and the final
# parameters of NAME within TOL (1e-5) relative of REF's
same() {
  python3 - "$DT_TMP/$1" "$DT_TMP/$2" "${3:-1e-5}" "${4:-1}" <<'PY'
import json, sys, numpy as np
a, b, tol, first = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
ra = {j["step"]: j for j in map(json.loads, open(a + "/metrics.jsonl"))}
rb = {j["step"]: j for j in map(json.loads, open(b + "/metrics.jsonl"))}
steps = [s for s in range(first, 21)]
assert all(s in ra and s in rb for s in steps), (sorted(ra), sorted(rb))
dl = max(abs(ra[s][k] - rb[s][k]) / abs(rb[s][k]) for s in steps for k in ("loss", "val_loss") if k in rb[s])
assert all(("val_loss" in ra[s]) == ("val_loss" in rb[s]) for s in steps)
pa, pb = np.fromfile(a + ".bin", np.float32), np.fromfile(b + ".bin", np.float32)
assert pa.size == pb.size, (pa.size, pb.size)
dp = float(np.linalg.norm(pa - pb) / np.linalg.norm(pb))
print(f"{a.split('/')[-1]}: losses {dl:.1e}, parameters {dp:.1e} relative")
assert dl < tol and dp < tol, ("loss", dl, "params", dp)
PY
}

run ref 1 gpt || fail "gpt 1-rank reference"
# DP ranks evaluate their own validation batches: no evaluation where DP > 1 is compared
run ref8 1 gpt gradient_accumulation_steps=8 eval.every_steps=0 || fail "gpt 1-rank reference, accumulation 8"
for p in 2 4; do
  for s in gpipe 1f1b; do
    if run "g_p${p}_$s" "$p" gpt pipeline.stages=$p pipeline.schedule=$s; then
      check "gpt PP=$p $s (tied head across the first and last stage) equals 1 rank" same "g_p${p}_$s" ref
    else fail "gpt PP=$p $s"; fi
  done
done
if run g_p2_int 2 gpt pipeline.stages=2 pipeline.schedule=interleaved pipeline.virtual_stages=2; then
  check "gpt PP=2 interleaved (2 chunks per rank) equals 1 rank" same g_p2_int ref
else fail "gpt PP=2 interleaved"; fi
grep -q 'pipeline of 2 stages x 2 chunks each, interleaved schedule' "$DT_TMP/g_p2_int.out" &&
  pass "the interleaved partition line names the chunks per rank" ||
  fail "interleaved partition line" "$(grep 'pipeline of' "$DT_TMP/g_p2_int.out" | head -1)"
grep -q 'stage 1: layers 2-3 (2) + final norm, head and loss' "$DT_TMP/g_p2_1f1b.out" &&
  pass "the partition is printed at start (layers, parameters, FLOPs per stage)" ||
  fail "partition line" "$(grep 'stage' "$DT_TMP/g_p2_1f1b.out" | head -3)"

run l_ref 1 llama || fail "llama 1-rank reference"
run lt_ref 1 llama model.tie_word_embeddings=true || fail "llama tied 1-rank reference"
if run l_p2 2 llama pipeline.stages=2 && run l_p4 4 llama pipeline.stages=4 pipeline.schedule=gpipe \
     pipeline.partition=flops; then
  check "llama PP=2 1f1b equals 1 rank" same l_p2 l_ref
  check "llama PP=4 gpipe (flops partition) equals 1 rank" same l_p4 l_ref
else fail "llama PP"; fi
if run lt_p4 4 llama model.tie_word_embeddings=true pipeline.stages=4 &&
   run lt_p2i 2 llama model.tie_word_embeddings=true pipeline.stages=2 pipeline.schedule=interleaved \
     pipeline.virtual_stages=2; then
  check "llama tied PP=4 1f1b equals 1 rank" same lt_p4 lt_ref
  check "llama tied PP=2 interleaved equals 1 rank" same lt_p2i lt_ref
else fail "llama tied PP"; fi

# Every data-parallel strategy over the DP group of each stage, and 3D.
if run pd_zero2 4 gpt pipeline.stages=2 pipeline.schedule=interleaved pipeline.virtual_stages=2 strategy=zero2 \
     zero_optimization.reduce_bucket_size=500000000 eval.every_steps=0; then
  check "PP=2 (interleaved) x DP=2 zero2, buckets as large as the model: equals 1 rank with the global batch" \
    same pd_zero2 ref8
else fail "PP=2 x DP=2 zero2"; fi
for s in zero1 fsdp; do
  if run "3d_$s" 8 gpt tensor_parallel.size=2 pipeline.stages=2 strategy=$s eval.every_steps=0; then
    check "TP=2 x PP=2 x DP=2 $s (8 ranks) equals 1 rank with the global batch" same "3d_$s" ref8
  else fail "TP=2 x PP=2 x DP=2 $s"; fi
done

# Two agents on loopback addresses, TP=2 within each, the pipeline across them.
port=$(free_port)
for i in 1 0; do
  ( DTRUN_DUMP_PARAMS="$DT_TMP/nodes.bin" $T "$DTRUN" --nnodes 2 --nproc_per_node 2 --rdzv_endpoint 127.0.0.2:$port \
      --local_addr 127.0.0.$((i + 2)) --rdzv_conf join_timeout=30 "$DT_TMP/gpt.json" tensor_parallel.size=2 \
      pipeline.stages=2 log.dir="$DT_TMP/nodes" >"$DT_TMP/nodes$i.out" 2>&1; echo $? >"$DT_TMP/nodes$i.rc" ) &
done
wait
if [ "$(cat "$DT_TMP/nodes0.rc")$(cat "$DT_TMP/nodes1.rc")" = 00 ]; then
  check "TP=2 x PP=2 on two loopback nodes (stage 0 on 127.0.0.2, stage 1 on 127.0.0.3) equals 1 rank" same nodes ref
else fail "TP=2 x PP=2 on two nodes" "rc=$(cat "$DT_TMP"/nodes*.rc | tr -d '\n') $(tail -3 "$DT_TMP/nodes0.out")"; fi

# Checkpoint resharding across PP: saved at TP=2 x PP=2 after 10 steps, resumed at 1
# rank and at PP=4; export reads it whole.
if run save 4 gpt tensor_parallel.size=2 pipeline.stages=2 train_steps=10 checkpoint.dir="$DT_TMP/ck" \
     checkpoint.every_steps=10; then
  for p in 1 4; do
    rm -rf "$DT_TMP/ck$p" && mkdir -p "$DT_TMP/ck$p" && cp -r "$DT_TMP/ck/step_00000010" "$DT_TMP/ck$p/" &&
      echo step_00000010 >"$DT_TMP/ck$p/latest"
    if run "res$p" "$p" gpt pipeline.stages=$p checkpoint.dir="$DT_TMP/ck$p" checkpoint.every_steps=100 \
         checkpoint.resume=auto; then
      grep -q "resumed from .*step_00000010" "$DT_TMP/res$p.out" &&
        check "saved at TP=2 x PP=2, resumed at PP=$p: losses continue within 1e-5" same "res$p" ref 1e-5 11 ||
        fail "resume at PP=$p" "$(grep -i resum "$DT_TMP/res$p.out" | head -2)"
    else fail "resume at PP=$p"; fi
  done
  if "$DTRUN" export "$DT_TMP/ck" -o "$DT_TMP/pp.safetensors" >"$DT_TMP/export.out" 2>&1; then
    python3 - "$DT_TMP/pp.safetensors" <<'PY' && pass "export of a TP x PP checkpoint: every tensor, global shapes" || fail "export of a PP checkpoint"
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
assert h["h.3.attn.c_attn.weight"]["shape"] == [32, 96], h["h.3.attn.c_attn.weight"]
assert h["h.0.mlp.c_proj.weight"]["shape"] == [128, 32] and "ln_f.weight" in h and "wte.weight" in h
assert sum(1 for k in h if k.startswith("h.")) == 4 * 12, sorted(h)
PY
  else fail "export of a PP checkpoint" "$(tail -3 "$DT_TMP/export.out")"; fi
else fail "save at TP=2 x PP=2"; fi

# Activation memory: the arenas each stage held are the schedule's, and its bytes that many arenas.
python3 - "$DT_TMP" <<'PY' && pass "activation arenas: 1F1B P-s (+1 receiving ahead, stage 0 the most), GPipe m; bytes = arenas x one arena" || fail "activation arenas"
import json, sys
d = sys.argv[1]
def ranks(n): return json.load(open(f"{d}/{n}/summary.json"))["ranks"]
f, g = ranks("g_p4_1f1b"), ranks("g_p4_gpipe")
assert [r["pipeline"]["activation_arenas"] for r in f] == [4, 4, 3, 2], [r["pipeline"] for r in f]
assert [r["pipeline"]["activation_arenas"] for r in g] == [4, 4, 4, 4], [r["pipeline"] for r in g]
for a, b in zip(f, g):  # the same stage layout: one arena is the same bytes under both schedules
    one = a["activation_bytes"] / a["pipeline"]["activation_arenas"]
    assert b["activation_bytes"] == one * b["pipeline"]["activation_arenas"], (a, b)
print("activation bytes per stage, 1F1B:", [r["activation_bytes"] for r in f], "GPipe:", [r["activation_bytes"] for r in g])
PY
python3 - "$DT_TMP" <<'PY' && pass "3D rank layout: TP innermost, then PP, then DP (stages of ranks 0-7: 0 0 1 1 0 0 1 1)" || fail "3D rank layout"
import json, sys
d = sys.argv[1]
g = json.load(open(f"{d}/3d_zero1/summary.json"))
assert g["parallel"]["pipeline_parallel"] == 2 and g["parallel"]["tensor_parallel"] == 2 and g["parallel"]["data_parallel"] == 2
assert [r["pipeline"]["stage"] for r in g["ranks"]] == [0, 0, 1, 1] * 2, [r["pipeline"] for r in g["ranks"]]
PY

# The bubble: balanced stages of 30 ms forward, 60 ms backward. The delay must dwarf
# the real compute and messages: at 10 ms, 4 ranks on one core shared with a busy
# process measured 0.20-0.23 against the formula's 0.158 at m=16 (30 ms: 0.175-0.181).
# Under the sanitizers (DTRUN_TEST_TIME_SCALE, 4) the compute is slower, the delay too.
delay=$((30 * ${DTRUN_TEST_TIME_SCALE:-1}))
for s in gpipe 1f1b; do
  for m in 4 16; do
    DTRUN_PP_TEST_DELAY_MS=$delay $T "$DTRUN" --standalone --nproc_per_node 4 "$DT_TMP/gpt.json" pipeline.stages=4 \
      pipeline.schedule=$s gradient_accumulation_steps=$m train_steps=4 eval.every_steps=0 \
      log.dir="$DT_TMP/b_${s}_$m" >"$DT_TMP/b.out" 2>&1 || fail "bubble run $s m=$m" "$(tail -3 "$DT_TMP/b.out")"
    python3 - "$DT_TMP/b_${s}_$m/metrics.jsonl" "$s" "$m" <<'PY' && pass "measured bubble of $s at P=4, m=$m within 4 points of the formula" || fail "bubble $s m=$m"
import json, sys
rows = [j for j in map(json.loads, open(sys.argv[1])) if j["step"] >= 2]
got = sum(j["pp_bubble"] for j in rows) / len(rows); want = rows[0]["pp_bubble_ideal"]
m = int(sys.argv[3]); assert abs(want - 3 / (m + 3)) < 1e-12, want
print(f"{sys.argv[2]} m={m}: measured bubble {got:.3f}, formula {want:.3f}")
assert abs(got - want) < 0.04, (got, want)
PY
  done
done

# Bad layouts: exit 2 before anything starts, naming the key.
bad() {
  local want=$1; shift
  $T "$DTRUN" --standalone --nproc_per_node 4 "$DT_TMP/gpt.json" log.dir="$DT_TMP/bad" "$@" >"$DT_TMP/bad.out" 2>&1
  local rc=$?
  [ $rc -eq 2 ] && grep -q -- "$want" "$DT_TMP/bad.out" && ! grep -q '\[rank' "$DT_TMP/bad.out"
}
check "1f1b with fewer micro-batches than stages: exit 2 naming gradient_accumulation_steps" \
  bad "1f1b needs at least as many micro-batches" pipeline.stages=4 gradient_accumulation_steps=2
check "more chunks than layers: exit 2 naming pipeline.stages and virtual_stages" \
  bad "pipeline.virtual_stages (2) = 8 chunks, but the model has 4 layers" pipeline.stages=4 \
  pipeline.schedule=interleaved pipeline.virtual_stages=2
check "a layout that does not divide the world: exit 2" bad "pipeline.stages 3" pipeline.stages=3
check "tensor_parallel x pipeline.stages = 8 on 4 ranks: exit 2" bad "= 8: expected a divisor of the world size 4" \
  pipeline.stages=4 tensor_parallel.size=2

# A stopped stage: its neighbour's receive times out naming the op, the peer and the sequence number.
$T "$DTRUN" --standalone --nproc_per_node 2 "$DT_TMP/gpt.json" pipeline.stages=2 train_steps=100000 \
  comm.timeout_s=4 log.dir="$DT_TMP/hang" >"$DT_TMP/hang.out" 2>&1 &
lpid=$!
for _ in $(seq 100); do grep -q 'step 3/' "$DT_TMP/hang.out" && break; sleep 0.1; done
w1=$(pgrep -f "__worker.*$DT_TMP/gpt.json" | while read -r p; do tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx RANK=1 && echo $p; done | head -1)
[ -n "$w1" ] && kill -STOP "$w1"
# once stage 0 reports, the stopped worker may go (else the group's stop waits out its grace)
for _ in $(seq 300); do grep -q 'training failed' "$DT_TMP/hang.out" && break; sleep 0.1; done
[ -n "$w1" ] && kill -CONT "$w1" 2>/dev/null
wait $lpid; rc=$?
# (stage 0 waits either for stage 1's messages, or, its passes done, in a collective: the
# step's last one, or the broadcast that refreshes the last stage's copy of the tied
# embedding, "pipeline stage 0: refreshing ...: broadcast #53 ...; 1 no report")
if [ $rc -eq 1 ] && grep -Eq 'rank 0: training failed: timed out: (pipeline stage 0: .*(recv|send) #[0-9]+ (from|to) rank 1 \(count [0-9]+, f32\)|(pipeline stage 0: .*)?[a-z_]+ #[0-9]+ .* 1 no report)' "$DT_TMP/hang.out"; then
  pass "a stopped stage: exit 1, the neighbour's error names the op, the peer and the sequence number"
else fail "a stopped stage" "rc=$rc $(grep -m2 -E 'error|timed|did not' "$DT_TMP/hang.out")"; fi

# A stage that dies: the group restarts as it does without a pipeline, resumes from the
# last checkpoint and ends as the run that never failed.
if DTRUN_FAULT_KILL_STEP=12 DTRUN_FAULT_KILL_RANK=1 DTRUN_DUMP_PARAMS="$DT_TMP/die.bin" $T "$DTRUN" --standalone \
     --nproc_per_node 2 --max_restarts 1 "$DT_TMP/gpt.json" pipeline.stages=2 checkpoint.dir="$DT_TMP/ckd" \
     checkpoint.every_steps=10 checkpoint.resume=auto log.dir="$DT_TMP/die" >"$DT_TMP/die.out" 2>&1 &&
   grep -q "resumed from .*step_00000010" "$DT_TMP/die.out"; then
  check "a stage killed at step 12: the group restarts from step 10 and ends as 1 rank does" same die ref 1e-5 11
else fail "a stage that dies" "$(grep -m3 -Ei 'error|restart|resum' "$DT_TMP/die.out")"; fi

# On the emulated GPU: two ranks sharing it at PP=2 (fp32) against one rank there.
EMU=${DTRUN_EMU:-$PWD/dtrun-emu}
if [ -x "$EMU" ]; then
  if DTRUN="$EMU" run emu1 1 gpt device=cuda bf16.enabled=false && \
     DTRUN="$EMU" run emu_p2 2 gpt device=cuda bf16.enabled=false pipeline.stages=2; then
    check "emulated GPU: PP=2 (1f1b, tied head) equals 1 rank within 1e-4" same emu_p2 emu1 1e-4
  else fail "PP=2 on the emulated GPU"; fi
else skip "PP=2 on the emulated GPU" "no $EMU (not built in SAN runs)"; fi
finish
