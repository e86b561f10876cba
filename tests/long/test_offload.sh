#!/usr/bin/env bash
# test_offload.sh - optimizer offload (zero_optimization.offload_optimizer, ZeRO-Offload)
# on the emulated GPU (dtrun-emu, see test_cuda_emu.sh): for zero1, zero2 and fsdp, on 1
# and 2 ranks (sharing the GPU through shm, device memory unreadable from the host:
# DTRUN_CUEMU_HOST_GUARD), the run with the optimizer state in host memory and AdamW on
# the CPU gives the losses of the same run without offload (bf16: within 1e-3 relative;
# fp32: within 1e-6); the device's model state drops to the strategy's parameters and
# gradients (master 0, optim 0) and the host holds 12 + 2 (bf16 gradient copy) bytes per
# shard element, as summary.json reports; a checkpoint saved with offload resumes without
# it and the reverse, on the uninterrupted run's losses (fp32, 1e-6: m and v travel);
# pin_memory false trains the same; ddp with offload is a config error naming the key
# (exit 2), and on the CPU device offload is a warning with no effect (bitwise the same).
source "$(dirname "$0")/../integration/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
EMU=${DTRUN_EMU:-$ROOT/dtrun-emu}
if [ ! -x "$EMU" ]; then
  skip "optimizer offload on the emulated GPU" "no $EMU (the emulator build is not part of SAN runs)"
  finish
fi

make_text "$DT_TMP/text.txt" 3 4000
cat >"$DT_TMP/gpt.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 16, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "train_steps": 8, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "eval": {"every_steps": 0}, "threads": 2, "seed": 11,
 "zero_optimization": {"reduce_bucket_size": 3000},
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
OFF=zero_optimization.offload_optimizer.device=cpu
# run NAME BINARY NPROC KEY=VALUE...: a launch; logs under $DT_TMP/NAME
run() {
  local name=$1 bin=$2 np=$3; shift 3
  DTRUN_CUEMU_HOST_GUARD=1 timeout 300 "$bin" --standalone --nproc_per_node "$np" "$DT_TMP/gpt.json" \
    log.dir="$DT_TMP/$name" "$@" >"$DT_TMP/$name.out" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || echo "run $name: exit $rc: $(tail -5 "$DT_TMP/$name.out")"
  return $rc
}
# close NAME A B TOL [FIRST]: losses of runs A and B from step FIRST on agree within TOL (relative)
close() {
  python3 - "$DT_TMP/$2/metrics.jsonl" "$DT_TMP/$3/metrics.jsonl" "$4" "${5:-1}" <<'PY' && pass "$1" || fail "$1"
import json, sys
a = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
b = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2]))}
tol, first = float(sys.argv[3]), int(sys.argv[4])
want = list(range(first, 9))
assert [s for s in sorted(a) if s >= first] == want and all(s in b for s in want), (sorted(a), sorted(b))
d = max(abs(a[s] - b[s]) / abs(b[s]) for s in want)
print(f"max relative difference {d:.2e} (tolerance {tol:g}); loss {a[first]:.4f} -> {a[8]:.4f}")
assert d <= tol, d
assert a[8] < b[1] - 0.3, "the loss does not fall"
PY
}
# mem NAME RUN STRATEGY ES: device and host model-state bytes of every rank as the formulas
mem() {
  python3 - "$DT_TMP/$2/summary.json" "$3" "$4" <<'PY' && pass "$1" || fail "$1"
import json, sys
s = json.load(open(sys.argv[1]))
st, es = sys.argv[2], int(sys.argv[3])
P, N = s["padded_params"], s["n_shards"]
assert s["offload_optimizer"] == "cpu", s["offload_optimizer"]
for r in s["ranks"]:
    ms, h = r["model_state_bytes"], r["host_state_bytes"]
    params = es * P // N if st == "fsdp" else es * P
    grads = es * P if st == "zero1" else es * P // N
    want = {"params": params, "grads": grads, "master": 0, "optim": 0}
    assert all(ms[k] == v for k, v in want.items()), (r["rank"], ms, want)
    assert ms["total"] == ms["expected"] == params + grads, ms
    hw = {"master": 4 * P // N, "optim": 8 * P // N, "grads": es * P // N}
    assert all(h[k] == v for k, v in hw.items()), (r["rank"], h, hw)
    assert h["total"] == h["expected"] == (12 + es) * P // N, h
print(f"{st}: {N} shard(s) of {P // N} elements; device {s['ranks'][0]['model_state_bytes']['total']} B, "
      f"host {s['ranks'][0]['host_state_bytes']['total']} B")
PY
}

for np in 1 2; do
  for st in zero1 zero2 fsdp; do
    if run "b_${st}_$np" "$EMU" $np device=cuda bf16.enabled=true strategy=$st &&
       run "bo_${st}_$np" "$EMU" $np device=cuda bf16.enabled=true strategy=$st $OFF; then
      close "$st, $np rank(s), bf16: offload vs none within 1e-3" "bo_${st}_$np" "b_${st}_$np" 1e-3
      mem "$st, $np rank(s), bf16: device 2+2 bytes per parameter as the strategy keeps them, host 14 per shard element" \
        "bo_${st}_$np" $st 2
    else fail "$st, $np rank(s), bf16 runs"; fi
  done
done
for st in zero2 fsdp; do
  if run "f_$st" "$EMU" 2 device=cuda bf16.enabled=false strategy=$st &&
     run "fo_$st" "$EMU" 2 device=cuda bf16.enabled=false strategy=$st $OFF; then
    close "$st, 2 ranks, fp32: offload vs none within 1e-6" "fo_$st" "f_$st" 1e-6
    mem "$st, 2 ranks, fp32: host 16 bytes per shard element" "fo_$st" $st 4
  else fail "$st, 2 ranks, fp32 runs"; fi
done
if run bo_np "$EMU" 2 device=cuda bf16.enabled=true strategy=zero2 $OFF zero_optimization.offload_optimizer.pin_memory=false; then
  close "pin_memory false (blocking copies): the pinned run's losses" bo_np bo_zero2_2 1e-6
else fail "pin_memory false run"; fi

# Checkpoints: saved with offload, resumed without (and the reverse), steps 5-8 as the
# uninterrupted run without offload: the host ranges carry the masters, m and v.
for way in on_off off_on; do
  a=; b=; [ $way = on_off ] && a=$OFF || b=$OFF
  C="checkpoint.dir=$DT_TMP/ck_$way checkpoint.every_steps=4"
  if run "ck_a_$way" "$EMU" 2 device=cuda bf16.enabled=false strategy=zero2 $C train_steps=4 $a &&
     run "ck_b_$way" "$EMU" 2 device=cuda bf16.enabled=false strategy=fsdp $C checkpoint.resume=auto $b; then
    close "checkpoint saved ${a:+with}${b:+without} offload (zero2), resumed ${b:+with}${a:+without} (fsdp): steps 5-8 within 1e-6" \
      "ck_b_$way" f_fsdp 1e-6 5
    grep -q "resumed from" "$DT_TMP/ck_b_$way.out" || fail "the second run resumed" "$(tail -3 "$DT_TMP/ck_b_$way.out")"
  else fail "checkpoint runs ($way)"; fi
done

# ddp has no optimizer shard: refused before anything starts, naming the key.
"$EMU" --standalone --nproc_per_node 1 "$DT_TMP/gpt.json" device=cuda strategy=ddp $OFF >"$DT_TMP/ddp.out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "zero_optimization.offload_optimizer.device cpu: expected a sharded optimizer" "$DT_TMP/ddp.out" &&
  pass "ddp with offload: exit 2 naming the key" || fail "ddp with offload refused" "exit $rc: $(tail -3 "$DT_TMP/ddp.out")"
"$EMU" --standalone --nproc_per_node 1 "$DT_TMP/gpt.json" device=cuda strategy=zero2 \
  zero_optimization.offload_optimizer.device=nvme >"$DT_TMP/nvme.out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "zero_optimization.offload_optimizer.device" "$DT_TMP/nvme.out" &&
  pass "offload device nvme: exit 2 naming the key" || fail "offload device nvme refused" "exit $rc: $(tail -3 "$DT_TMP/nvme.out")"
# The CPU device: a warning, and the same bits as without.
if run cpu_z2 "$DTRUN" 1 device=cpu strategy=zero2 train_steps=3 && run cpu_z2o "$DTRUN" 1 device=cpu strategy=zero2 train_steps=3 $OFF; then
  grep -q "no effect on the CPU device" "$DT_TMP/cpu_z2o.out" && cmp -s <(grep -o '"loss":[^,]*' "$DT_TMP/cpu_z2/metrics.jsonl") \
    <(grep -o '"loss":[^,]*' "$DT_TMP/cpu_z2o/metrics.jsonl") && pass "CPU device: offload warns and changes nothing" ||
    fail "CPU device: offload warns and changes nothing" "$(grep -i offload "$DT_TMP/cpu_z2o.out" | head -2)"
else fail "CPU device runs"; fi
finish
