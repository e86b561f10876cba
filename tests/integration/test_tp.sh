#!/usr/bin/env bash
# test_tp.sh - tensor parallelism (Megatron) on gpt as users run it, through the real
# launcher: TP=2 and TP=4 on one node, with and without sequence parallelism, train
# exactly as 1 rank with the same global batch (losses within 1e-5 relative over 20
# steps, final parameters within 1e-5 relative L2: DTRUN_DUMP_PARAMS gathers the whole
# model from the TP pieces); TP=2 x DP=2 with each of ddp, zero1, zero2, fsdp equals 1
# rank with accumulation 2; every rank's model-state bytes equal the strategy's formula
# over the TP piece, whose size is the replicated tensors plus 1/T of the cut ones;
# sequence parallelism shrinks the activation arena; a checkpoint saved at TP=2 x DP=2
# resumes at TP=1 and TP=4 with the losses continuing within 1e-5, and exports to
# safetensors with the global shapes; two ranks sharing the emulated GPU at TP=2 train as
# one rank there. llama's cases are in test_tp_llama.sh.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
T="timeout -k 2 90"

make_text "$DT_TMP/text.txt" 1 3000
# 4 heads of 8, so TP=4 holds one head per rank.
cat > "$DT_TMP/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 2, "train_steps": 20, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "zero_optimization": {"reduce_bucket_size": 6000},
 "eval": {"every_steps": 0}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON

# run NAME NPROC ARGS...: trains, dumps the whole model's parameters to $DT_TMP/NAME.bin
run() {
  local name=$1 np=$2; shift 2
  DTRUN_DUMP_PARAMS="$DT_TMP/$name.bin" $T "${BIN:-$DTRUN}" --standalone --nproc_per_node "$np" \
    "$DT_TMP/gpt.json" log.dir="$DT_TMP/$name" "$@" >"$DT_TMP/$name.out" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || echo "run $name: exit $rc: $(tail -5 "$DT_TMP/$name.out")"
  return $rc
}
# same NAME REF [TOL] [FIRST]: losses (from step FIRST on) and final parameters of NAME
# within TOL (1e-5) relative of REF's
same() {
  python3 - "$DT_TMP/$1" "$DT_TMP/$2" "${3:-1e-5}" "${4:-1}" <<'PY'
import json, sys, numpy as np
a, b, tol, first = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
la = {j["step"]: j["loss"] for j in map(json.loads, open(a + "/metrics.jsonl"))}
lb = {j["step"]: j["loss"] for j in map(json.loads, open(b + "/metrics.jsonl"))}
steps = [s for s in range(first, 21)]
assert all(s in la and s in lb for s in steps), (sorted(la), sorted(lb))
dl = max(abs(la[s] - lb[s]) / abs(lb[s]) for s in steps)
pa, pb = np.fromfile(a + ".bin", np.float32), np.fromfile(b + ".bin", np.float32)
assert pa.size == pb.size, (pa.size, pb.size)
dp = float(np.linalg.norm(pa - pb) / np.linalg.norm(pb))
print(f"losses {dl:.1e}, parameters {dp:.1e} relative")
assert dl < tol and dp < tol, ("loss", dl, "params", dp)
PY
}
# mem NAME STRATEGY TP: every rank's model-state bytes equal the strategy's formula over
# its TP piece (Ψ = the piece's parameters: gpt's replicated wpe, norms and row-parallel
# biases whole, everything else / TP), and the piece's size is that count
mem() {
  python3 - "$DT_TMP/$1/summary.json" "$2" "$3" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); st = sys.argv[2]; tp = int(sys.argv[3])
L, C, V, T = 2, 32, 256, 32
rep = T * C + L * (4 * C + 2 * C) + 2 * C          # wpe, ln_1/ln_2, the c_proj biases, ln_f
cut = V * C + L * (3 * C * C + 3 * C + C * C + 4 * C * C + 4 * C + 4 * C * C)
P = rep + cut // tp
assert s["n_params"] == P, (s["n_params"], P)
assert s["parallel"]["tensor_parallel"] == tp and s["parallel"]["data_parallel"] * tp == s["world_size"], s["parallel"]
Pp, N = s["padded_params"], s["n_shards"]
want = {"ddp": 16 * P, "zero1": 8 * Pp + 8 * Pp // N, "zero2": 4 * Pp + 12 * Pp // N, "fsdp": 16 * Pp // N}[st]
for r in s["ranks"]:
    ms = r["model_state_bytes"]
    assert ms["total"] == want == ms["expected"], (r["rank"], ms, want)
PY
}

run ref 1 || fail "1-rank reference run"
run ref_a2 1 gradient_accumulation_steps=2 || fail "1-rank reference run, accumulation 2"

for tp in 2 4; do
  for sp in false true; do
    name=tp${tp}_sp$sp
    if run "$name" "$tp" tensor_parallel.size=$tp tensor_parallel.sequence_parallel=$sp; then
      check "gpt TP=$tp (sequence_parallel $sp) equals 1 rank: losses and parameters within 1e-5" same "$name" ref
      check "gpt TP=$tp (sequence_parallel $sp): model state = 16 bytes x the TP piece" mem "$name" ddp "$tp"
    else fail "gpt TP=$tp sequence_parallel $sp"; fi
  done
done
grep -q '"tp_comm_ms"' "$DT_TMP/tp2_spfalse/metrics.jsonl" && ! grep -q '"tp_comm_ms"' "$DT_TMP/ref/metrics.jsonl" &&
  pass "metrics.jsonl has tp_comm_ms under TP only" || fail "metrics.jsonl tp_comm_ms"

# Sequence parallelism: the norm/residual slots hold 1/T of the rows; the arena shrinks.
python3 - "$DT_TMP" <<'PY' && pass "sequence parallelism: TP=2 activations below TP=2 without it, TP=4 below TP=2" || fail "sequence-parallel activation bytes"
import json, sys
act = lambda n: json.load(open(f"{sys.argv[1]}/{n}/summary.json"))["ranks"][0]["activation_bytes"]
a1, a2, a2s, a4s = act("ref"), act("tp2_spfalse"), act("tp2_sptrue"), act("tp4_sptrue")
print(f"activation bytes per rank: 1 rank {a1}, TP=2 {a2}, TP=2+SP {a2s}, TP=4+SP {a4s}")
assert a2 < a1 and a2s < a2 and a4s < a2s, (a1, a2, a2s, a4s)
PY

for s in ddp zero1 zero2 fsdp; do
  if run "tp2dp2_$s" 4 tensor_parallel.size=2 strategy=$s train_batch_size=4; then
    check "gpt TP=2 x DP=2 $s equals 1 rank with accumulation 2" same "tp2dp2_$s" ref_a2
    check "gpt TP=2 x DP=2 $s: model state per rank as the formula" mem "tp2dp2_$s" "$s" 2
  else fail "gpt TP=2 x DP=2 $s"; fi
done

# Checkpoint resharding across TP sizes: saved at TP=2 x DP=2 (zero1) after 10 steps,
# resumed at TP=1 (accumulation 2) and TP=4 (accumulation 2).
if run save 4 tensor_parallel.size=2 strategy=zero1 train_batch_size=4 train_steps=10 \
     checkpoint.dir="$DT_TMP/ck" checkpoint.every_steps=10; then
  grep -q '"stride"' "$DT_TMP/ck/step_00000010/meta.json" &&
    pass "a TP checkpoint lists a row-parallel weight's columns as strided ranges" || fail "strided ranges in meta.json"
  for tp in 1 4; do
    rm -rf "$DT_TMP/ck$tp" && mkdir -p "$DT_TMP/ck$tp" && cp -r "$DT_TMP/ck/step_00000010" "$DT_TMP/ck$tp/" &&
      echo step_00000010 >"$DT_TMP/ck$tp/latest"
    if run "res$tp" "$tp" tensor_parallel.size=$tp gradient_accumulation_steps=2 checkpoint.dir="$DT_TMP/ck$tp" \
         checkpoint.every_steps=100 checkpoint.resume=auto; then
      grep -q "resumed from .*step_00000010" "$DT_TMP/res$tp.out" &&
        check "saved at TP=2 x DP=2, resumed at TP=$tp: losses continue within 1e-5" same "res$tp" ref_a2 1e-5 11 ||
        fail "resume at TP=$tp" "$(grep -i resum "$DT_TMP/res$tp.out" | head -2)"
    else fail "resume at TP=$tp"; fi
  done
  if "$DTRUN" export "$DT_TMP/ck" -o "$DT_TMP/tp.safetensors" >"$DT_TMP/export.out" 2>&1; then
    python3 - "$DT_TMP/tp.safetensors" <<'PY' && pass "export of a TP checkpoint: global shapes" || fail "export of a TP checkpoint"
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
assert h["h.0.attn.c_attn.weight"]["shape"] == [32, 96], h["h.0.attn.c_attn.weight"]
assert h["h.0.mlp.c_proj.weight"]["shape"] == [128, 32], h["h.0.mlp.c_proj.weight"]
assert h["wte.weight"]["shape"][1] == 32
PY
  else fail "export of a TP checkpoint" "$(tail -3 "$DT_TMP/export.out")"; fi
else fail "save at TP=2 x DP=2"; fi

# Two ranks sharing the one emulated GPU at TP=2 (fp32) against one rank there.
EMU=${DTRUN_EMU:-$PWD/dtrun-emu}
if [ -x "$EMU" ]; then
  if BIN=$EMU run emu1 1 device=cuda bf16.enabled=false && BIN=$EMU run emu_tp2 2 device=cuda bf16.enabled=false \
       tensor_parallel.size=2 tensor_parallel.sequence_parallel=true; then
    check "emulated GPU: TP=2 (sequence parallel) on one shared GPU equals 1 rank within 1e-4" same emu_tp2 emu1 1e-4
  else fail "TP=2 on the emulated GPU"; fi
else skip "TP=2 on the emulated GPU" "no $EMU (not built in SAN runs)"; fi
finish
