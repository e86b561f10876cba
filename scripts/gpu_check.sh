#!/usr/bin/env bash
# gpu_check.sh - the whole GPU verdict in one call on the GPU machine (one H200):
# made here with scripts/gpu_pack.sh, then there `bash scripts/gpu_check.sh` with
# carry [".carry"]. Needs no network and builds nothing there: it unpacks
# .carry/gpu_check.tar.gz to /tmp, resolves every binary's libraries (preflight),
# then runs the checks below. Each check prints its row (PASS/FAIL/SKIP and why)
# the moment it ends and appends it to $OUT/table.txt; after GPU_CHECK_DEADLINE
# seconds (default 480) the remaining rows print SKIP (deadline). At the end: the
# table again, and all logs in one $OUT/logs.tar.gz (no data files), which is
# also rewritten after every row so that a killed run still returns them.
#
# Rows: preflight; dtrun loads the CUDA library on demand; every tests/gpu/test_*
# binary (CUDA ops vs the CPU ops, the fused attention, the Llama ops and decoding,
# the plan's arena) and the emulator's own tests, with DTRUN_CUDA_SYNC_OPS=1 so a
# GPU fault names its op; NCCL at world size 1 (test_comm_nccl, `bench comm
# --device cuda` over NCCL); the NCCL watchdog: an op held past comm.timeout_s
# (1 s) while nobody waits is aborted by the watchdog's thread (ncclCommAbort) and
# fails naming it (test_comm_nccl's watchdog test); a small GPT trained on the GPU
# against the CPU from the same init (step 1 tight, later steps loose: Adam
# amplifies rounding in near-zero gradients), in fp32 and bf16, with two ranks
# sharing the GPU over shm, and as 2 pipeline stages; GPT-2 124M bf16 tokens/s and
# MFU with the cuBLAS and the fused attention; its peak GPU memory against `dtrun
# plan` (10%); PyTorch's torch.compile on the same model and batch and the ratio;
# the memory check on the GPU: a micro-batch over the GPU's whole memory (sized by
# `dtrun plan`) exits 2 naming "free on GPU" and a change, and that change trains a
# step in the same memory; checkpoint.async on the GPU (pinned staging): the same
# checkpoint bytes as synchronous saves, and the time a save blocked training
# (summary.json's ckpt_blocked_ms); `bench comm --device cuda` with two ranks over
# shm; compute-sanitizer racecheck on the fused attention test. (The rows added
# last come after the throughput rows, so a deadline cuts them first.)
#
# Libraries: LD_LIBRARY_PATH is set on our commands only, never on python3 (the
# image's PyTorch keeps its own). Order: the packed lib/, the system's, then, only
# when something is missing, PyTorch's nvidia/*/lib folders (found by python3
# without importing torch) and, library by library, the packed lib-fallback/
# (libmvec, the gcc runtime). ldd checks every packed binary and library.
# NCCL_DEBUG=WARN; when NCCL's init fails, the NCCL rows are run again with
# NCCL_CUMEM_HOST_ENABLE=0 (cuMem host allocations fail in some VMs), and say so.
#
# GPU_CHECK_EMU=1: the same script here against the CPU emulator of CUDA: packs
# the emulator build (GPU_CHECK_EMU=1 scripts/gpu_pack.sh), unpacks and preflights
# it as above, runs small sizes (the memory check on a 0.04 GiB emulated GPU,
# DTRUN_CUEMU_MEM_GB); NCCL, PyTorch and compute-sanitizer rows SKIP.
# Knobs: OUT (default /tmp/gpu_check_out), GPU_CHECK_DEADLINE, GPT2_BATCH (16),
# GPU_CHECK_KEEP=1 (keep the unpacked folder).
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
EMU=${GPU_CHECK_EMU:-0}
LIMIT=${GPU_CHECK_DEADLINE:-480}
DEADLINE=$(($(date +%s) + LIMIT))
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
rm -f "$OUT/table.txt" "$OUT/logs.tar.gz"
W=$(mktemp -d /tmp/gpu_check.XXXXXX)
PK=$W/pk L=$W/logs D=$W/data
mkdir -p "$PK" "$L" "$D"
export NCCL_DEBUG=WARN
NPROC=$(nproc 2>/dev/null || echo 2)
NFAIL=0
rows=()

# row NAME RESULT DETAIL: print the row now, keep it, save the logs so far
row() {
  local r; r=$(printf '%-46s %-4s %s' "$1" "$2" "$3")
  rows+=("$r")
  [ "$2" = FAIL ] && NFAIL=$((NFAIL + 1))
  printf '%s\n' "$r" | tee -a "$OUT/table.txt"
  tar -C "$W" -czf "$OUT/logs.tar.gz" logs 2>/dev/null
}
finish() {
  echo
  echo "GPU: $(cat "$L/gpu.txt" 2>/dev/null)"
  printf '%-46s %-4s %s\n' check res detail
  printf '%s\n' "${rows[@]}"
  echo "$NFAIL FAIL; $(( $(date +%s) - DEADLINE + LIMIT )) s; logs in $OUT/logs.tar.gz"
  tar -C "$W" -czf "$OUT/logs.tar.gz" logs 2>/dev/null
  [ "${GPU_CHECK_KEEP:-0}" = 1 ] || rm -rf "$W"
}
trap finish EXIT
trap 'exit 143' TERM INT  # the table and the logs archive still come out
# due NAME CAP: sets TO to the seconds this check may take (CAP, or what is left
# before the deadline); prints the SKIP row and fails when under 10 s are left.
due() {
  local left=$((DEADLINE - $(date +%s)))
  if [ "$left" -lt 10 ]; then row "$1" SKIP "deadline (GPU_CHECK_DEADLINE=$LIMIT s) passed"; return 1; fi
  TO=$(($2 < left ? $2 : left))
  CUT=$((TO < $2))  # 1: the deadline, not the check's own limit, bounds it
}
# ours CMD...: one of our binaries, time-limited, with our library path
ours() { timeout -k 5 "$TO" env LD_LIBRARY_PATH="$LDP" "$@"; }
clip() { tr '\n' ' ' | sed 's/  */ /g' | cut -c1-"${1:-160}"; }

# --- packing and unpacking --------------------------------------------------------
if [ "$EMU" = 1 ]; then
  ARCHIVE=.carry/gpu_check_emu.tar.gz
  GPU_CHECK_EMU=1 scripts/gpu_pack.sh >"$L/pack.log" 2>&1 ||
    { prc=$?; row "pack (GPU_CHECK_EMU=1 gpu_pack.sh)" FAIL "exit $prc: $(tail -3 "$L/pack.log" | clip)"; exit 1; }
  CUDALIB=libdtrun_cuda_emu.so
else
  ARCHIVE=.carry/gpu_check.tar.gz
  CUDALIB=libdtrun_cuda.so
fi
if ! tar -C "$PK" -xzf "$ARCHIVE" 2>"$L/unpack.log"; then
  row "unpack $ARCHIVE" FAIL "$(clip <"$L/unpack.log") (run scripts/gpu_pack.sh first)"; exit 1
fi
kib=$(($(stat -c %s "$ARCHIVE") / 1024))
row "archive $ARCHIVE" "$([ $kib -lt $((60 * 1024)) ] && echo PASS || echo FAIL)" \
  "$kib KiB (limit 60 MiB), $(find "$PK" -type f | wc -l) files unpacked to \$W=$W"
BIN=$PK/bin DT=$PK/bin/dtrun

# --- preflight ----------------------------------------------------------------------
LDP=$PK/lib
missing() {
  local b
  for b in "$BIN"/* "$PK"/lib/*; do
    LD_LIBRARY_PATH=$LDP ldd "$b" 2>&1 | grep 'not found' | sed "s|^[[:space:]]*|$(basename "$b"): |"
  done | sort -u
}
{
  echo "== nvidia-smi"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$L/gpu.txt"
    nvidia-smi
  elif [ "$EMU" = 1 ]; then echo "none (emulator run: the CPU emulator of CUDA)" | tee "$L/gpu.txt"
  else echo "no nvidia-smi on this machine" | tee "$L/gpu.txt"; fi
  m=$(missing)
  if [ -n "$m" ]; then
    echo "== missing with the packed lib/ and the system's:"; echo "$m"
    nv=$(python3 - <<'PY'
import glob, importlib.util, os
spec = importlib.util.find_spec("nvidia")  # the namespace package only; torch is not imported
dirs = []
for p in (spec.submodule_search_locations if spec else []):
    for d in sorted(glob.glob(os.path.join(p, "*", "lib")) + glob.glob(os.path.join(p, "*", "*", "lib"))):
        if glob.glob(os.path.join(d, "lib*.so*")):
            dirs.append(d)
print(":".join(dirs))
PY
)
    [ -n "$nv" ] && LDP=$LDP:$nv && echo "== + PyTorch's nvidia folders: $nv"
    m=$(missing)
    for n in $(awk '/=> not found/{print $2}' <<<"$m" | sort -u); do
      [ -e "$PK/lib-fallback/$n" ] && cp "$PK/lib-fallback/$n" "$PK/lib/" && echo "== + lib-fallback/$n"
    done
    m=$(missing)
  fi
  echo "== LD_LIBRARY_PATH for our commands: $LDP"
  echo "== CUDA libraries as resolved for $CUDALIB:"
  LD_LIBRARY_PATH=$LDP ldd "$BIN/$CUDALIB" | grep -E 'libcudart|libcublas|libnccl' |
    awk '{print $1, $3}' | while read -r n p; do echo "$n -> $(readlink -f "$p")"; done
  echo "== python3 packages (versions read from metadata, nothing imported):"
  python3 -c 'import importlib.metadata as m
for d in m.distributions():
    n = d.metadata["Name"] or ""
    if n.startswith("nvidia-") or n in ("torch", "triton"): print(n, d.version)' 2>&1 | sort
  echo "== still missing:"; echo "${m:-none}"
  printf '%s\n' "$LDP" >"$W/ldp"; printf '%s\n' "$m" >"$W/missing"
} >"$L/preflight.log" 2>&1
cat "$L/preflight.log"
LDP=$(cat "$W/ldp")
m=$(cat "$W/missing")
nbin=$(ls "$BIN" "$PK/lib" | grep -c '\.so\|^test_\|^dtrun$')
if [ -z "$m" ]; then row "preflight: ldd of $nbin packed files" PASS "LD_LIBRARY_PATH=${LDP//$W/\$W}"
else row "preflight: ldd of $nbin packed files" FAIL "missing: $(clip 200 <<<"$m")"; fi

# --- dtrun loads the CUDA library on demand ---------------------------------------
if due "dtrun loads $CUDALIB on demand" 30; then
  cudalib=$(ldd "$DT" | grep -E 'libcudart|libcublas|libnccl')
  ver=$(ours "$DT" --version 2>&1)
  if [ -z "$cudalib" ] && grep -q "cuda: $BIN/$CUDALIB" <<<"$ver" && ours "$DT" __cuda_probe >"$L/cuda_probe.log" 2>&1
  then row "dtrun loads $CUDALIB on demand" PASS "$ver"
  else row "dtrun loads $CUDALIB on demand" FAIL "ldd: ${cudalib:-none}; $ver; $(tail -1 "$L/cuda_probe.log")"; fi
fi

# --- NCCL: rerun once with NCCL_CUMEM_HOST_ENABLE=0 after an init failure --------
NCCL_ENV=() NCCL_NOTE=""
# nccl LOG CMD...: runs CMD with our library path into LOG; sets NOTE
nccl() {
  local log=$1; shift
  NOTE=$NCCL_NOTE
  ours env "${NCCL_ENV[@]}" "$@" >"$log" 2>&1 && return 0
  local rc=$?
  if [ -z "$NCCL_NOTE" ] && grep -qiE 'ncclCommInit|nccl.*init|cuMem|unhandled (system|cuda) error' "$log"; then
    mv "$log" "$log.first"
    NCCL_ENV=(NCCL_CUMEM_HOST_ENABLE=0)
    NCCL_NOTE="(NCCL init failed; retried with NCCL_CUMEM_HOST_ENABLE=0) "
    NOTE=$NCCL_NOTE
    ours env "${NCCL_ENV[@]}" "$@" >"$log" 2>&1
    return
  fi
  return $rc
}

# --- the test binaries ----------------------------------------------------------------
# criterion NAME BINARY CAP [nccl|-] [FILTER]: one row from a Criterion binary's
# synthesis line; FILTER (a Criterion --filter glob, SUITE/TEST*) runs only those tests
criterion() {
  local name=$1 bin=$BIN/$2 log=$L/$2.log rc flt=()
  due "$name" "$3" || return
  NOTE=""
  if [ -n "${5:-}" ]; then flt=(--filter "$5"); log=$L/$2.$(printf %s "${5%%\**}" | tr -c 'a-zA-Z0-9_' _).log; fi
  if [ "${4:-}" = nccl ]; then nccl "$log" env DTRUN_CUDA_SYNC_OPS=1 "$bin" --jobs "$NPROC" "${flt[@]}"; rc=$?
  else ours env DTRUN_CUDA_SYNC_OPS=1 "$bin" --jobs "$NPROC" "${flt[@]}" >"$log" 2>&1; rc=$?; fi
  local syn; syn=$(grep -a Synthesis "$log" | sed 's/.*Synthesis: //')
  local res=FAIL
  [ $rc -eq 0 ] && res=PASS
  case "$syn" in *"Tested: 0 "*) res=SKIP syn="no test ran (no GPU visible?): $syn" ;; esac
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    syn="timed out after ${TO}s; $syn"
    [ "$CUT" = 1 ] && res=SKIP syn="deadline: $syn"
  fi
  [ -z "$syn" ] && syn="exit $rc: $(tail -3 "$log" | clip)"
  row "$name" "$res" "$NOTE$syn"
}
declare -A LABEL=(
  [test_cuemu]="emulator semantics on the GPU (test_cuemu)"
  [test_kernels_cuda]="CUDA core ops vs CPU (test_kernels_cuda)"
  [test_kernels_cuda_layers]="CUDA layer ops vs CPU (..._layers)"
  [test_kernels_cuda_llama]="CUDA Llama ops vs CPU (..._llama)"
  [test_decode_cuda]="CUDA decoding vs CPU (test_decode_cuda)"
  [test_attention_fused]="fused attention vs CPU (test_attention_fused)"
  [test_plan_cuda]="plan = the trainer's CUDA arena (test_plan_cuda)"
)
for t in test_kernels_cuda test_kernels_cuda_layers test_attention_fused test_kernels_cuda_llama \
         test_decode_cuda test_plan_cuda test_cuemu; do
  if [ -x "$BIN/$t" ]; then criterion "${LABEL[$t]}" "$t" 150
  else row "${LABEL[$t]}" FAIL "$t is not in $ARCHIVE"; fi
done
for b in "$BIN"/test_*; do  # a test binary added later still runs
  t=$(basename "$b")
  [ -n "${LABEL[$t]:-}" ] || [ "$t" = test_comm_nccl ] || criterion "$t" "$t" 150
done

# --- NCCL at world size 1 -------------------------------------------------------------
# bench NAME NPROC [nccl] FLAGS...: `dtrun bench comm --device cuda` on device
# buffers: PASS when every size was exact; the largest size's time and bandwidths
bench() {
  local name=$1 np=$2 log=$L/bench_comm_$2.log kind=""; shift 2
  [ "${1:-}" = nccl ] && kind=nccl && shift
  due "$name" 120 || return
  NOTE=""
  if [ -n "$kind" ]; then nccl "$log" "$DT" --standalone --nproc_per_node "$np" bench comm --device cuda "$@"
  else ours "$DT" --standalone --nproc_per_node "$np" bench comm --device cuda "$@" >"$log" 2>&1; fi
  local rc=$?
  local last; last=$(grep -E '^\[rank0\]: +[0-9]+ ' "$log" | tail -1 | sed 's/^\[rank0\]: *//')
  local copy; copy=$(grep -o 'device-to-device copy[^:]*: [0-9.]* GB/s' "$log" | sed 's/.*: //')
  if [ $rc -eq 0 ] && grep -q 'out of bounds values: 0 OK' "$log" && [ -n "$last" ]; then
    set -- $last
    row "$name" PASS "$NOTE$1 B: $5 us, algbw $6, busbw $7 GB/s; d2d copy ${copy:-?}"
  else row "$name" FAIL "$NOTE""exit $rc: $(tail -2 "$log" | clip 140)"; fi
}
WDNAME="NCCL watchdog aborts a stalled op (timeout 1 s)"
if [ "$EMU" = 1 ]; then
  row "NCCL communicator, world size 1" SKIP "the emulator has no NCCL"
  row "$WDNAME" SKIP "the emulator has no NCCL"
  row "bench comm --device cuda, NCCL, 1 rank" SKIP "the emulator has no NCCL"
else
  if [ -x "$BIN/test_comm_nccl" ]; then
    criterion "NCCL communicator, world size 1" test_comm_nccl 120 nccl 'comm_nccl/every_op*'
    # an op held behind a host function on the compute stream, nobody waiting: the
    # watchdog's thread aborts the communicator (ncclCommAbort) and the op fails
    criterion "$WDNAME" test_comm_nccl 60 nccl 'comm_nccl/watchdog*'
  else
    row "NCCL communicator, world size 1" FAIL "test_comm_nccl is not in $ARCHIVE"
    row "$WDNAME" FAIL "test_comm_nccl is not in $ARCHIVE"
  fi
  bench "bench comm --device cuda, NCCL, 1 rank" 1 nccl --backend nccl --max 256M
fi

# --- a small GPT on the GPU against the CPU -------------------------------------------
python3 - "$D/text.txt" <<'PY'
import random, sys
r = random.Random(7)
words = [''.join(r.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(r.randint(2, 8))) for _ in range(400)]
with open(sys.argv[1], 'w') as f:
    for _ in range(60000):
        f.write(' '.join(r.choice(words) for _ in range(r.randint(3, 12))) + '.\n')
PY
if [ "$EMU" = 1 ]; then shape='"n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 16' mb=4 steps=12 th=1
else shape='"n_layer": 2, "n_head": 4, "n_embd": 128, "seq_len": 64' mb=8 steps=20 th=4; fi
cat >"$D/small.json" <<JSON
{"model": {"type": "gpt", $shape, "vocab_size": 256},
 "data": {"train": "$D/text.txt", "val_fraction": 0.01},
 "train_micro_batch_size_per_gpu": $mb, "train_steps": $steps, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
 "seed": 3, "threads": $th, "eval": {"every_steps": 0}, "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
# train NAME NPROC KEY=VALUE...: the small GPT, logs in $L/NAME
train() {
  local name=$1 np=$2; shift 2
  NOTE=""
  ours "$DT" --standalone --nproc_per_node "$np" "$D/small.json" log.dir="$L/$name" "$@" >"$L/$name.log" 2>&1
}
# compare NAME A B TOL1 TOL: row from the losses of runs A and B: step 1 within
# TOL1 relative, every later step within TOL, and the loss falls
compare() {
  local r; r=$(python3 - "$L/$2/metrics.jsonl" "$L/$3/metrics.jsonl" "$4" "$5" "$steps" <<'PY'
import json, sys
try:
    a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
    b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
except OSError as e:
    print(f"FAIL no metrics: {e}")
    sys.exit(0)
t1, t, n = float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
if len(a) != n or len(b) != n:
    print(f"FAIL {len(a)} and {len(b)} steps logged, not {n}")
    sys.exit(0)
d = [abs(x - y) / abs(y) for x, y in zip(a, b)]
ok = d[0] <= t1 and max(d[1:]) <= t and a[-1] < a[0] - 0.1
print(f"{'PASS' if ok else 'FAIL'} step 1 {d[0]:.1e} (tol {t1:g}), later max {max(d[1:]):.1e} (tol {t:g}); "
      f"loss {a[0]:.3f} -> {a[-1]:.3f}")
PY
)
  case "$r" in "FAIL no metrics"*) r="FAIL $(tail -2 "$L/$2.log" | clip 140)" ;; esac
  row "$1" "${r%% *}" "$NOTE${r#* }"
}
if due "GPT $steps steps, GPU vs CPU (fp32, bf16)" 200; then
  train cpu1 1 device=cpu
  train gpu1_fp32 1 device=cuda bf16.enabled=false
  compare "GPT $steps steps, GPU fp32 vs CPU" gpu1_fp32 cpu1 1e-4 1e-2
  if due "GPT $steps steps, GPU bf16 vs CPU" 120; then
    train gpu1_bf16 1 device=cuda bf16.enabled=true
    compare "GPT $steps steps, GPU bf16 vs CPU" gpu1_bf16 cpu1 1e-2 5e-2
  fi
fi
if due "2 ranks sharing the GPU (shm) vs 2 CPU ranks" 200; then
  train cpu2 2 device=cpu comm.backend=shm
  train gpu2_shm 2 device=cuda bf16.enabled=false comm.backend=shm
  compare "2 ranks sharing the GPU (shm) vs 2 CPU ranks" gpu2_shm cpu2 1e-4 1e-2
fi
if due "pipeline: 2 stages sharing the GPU (1f1b) vs 2 CPU ranks" 200; then
  [ -f "$L/cpu2/metrics.jsonl" ] || train cpu2 2 device=cpu comm.backend=shm
  # the same global batch: DP 2 x micro-batch vs PP 2 x 2 micro-batches of one DP rank
  train gpu_pp2 2 device=cuda bf16.enabled=false comm.backend=shm pipeline.stages=2 gradient_accumulation_steps=2
  compare "pipeline: 2 stages sharing the GPU (1f1b) vs 2 CPU ranks" gpu_pp2 cpu2 1e-4 1e-2
fi

# --- GPT-2 124M (tiny on the emulator): throughput, memory, PyTorch ----------------
B=${GPT2_BATCH:-16}
python3 - "$D" "$L" "$B" "$EMU" <<'PY'
import json, sys
d, logs, b, emu = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
c = json.load(open("configs/gpt2-124m.json"))
if emu:  # the emulator runs kernels on the CPU: a model of the same kind, tiny
    c["model"].update(n_layer=2, n_head=2, n_embd=32, seq_len=32)
    b = 2
c["data"] = {"train": d + "/text.txt", "val_fraction": 0.01}
c.update(train_steps=30, steps_per_print=1, train_micro_batch_size_per_gpu=b, gradient_accumulation_steps=1,
         train_batch_size=b, device="cuda")
c["bf16"] = {"enabled": True}
c["scheduler"]["params"]["warmup_num_steps"] = 10
c["eval"] = {"every_steps": 0}
c["checkpoint"] = {"every_steps": 0, "resume": "never"}
json.dump(c, open(d + "/gpt2.json", "w"), indent=1)
PY
[ "$EMU" = 1 ] && G2STEPS=8 G2WARM=3 G2NAME="tiny GPT (emulator)" || G2STEPS=30 G2WARM=10 G2NAME="GPT-2 124M bf16 B=$B"
# gpt2 NAME ATTENTION: trains gpt2.json with DTRUN_CUDA_ATTENTION=ATTENTION; one row
# (tokens/s and MFU after the warm-up steps); sets $ours (tokens/s) and, for the
# first run, the memory row: peak GPU memory against `dtrun plan` (10%)
gpt2() {
  local name=$1 att=$2 label="$G2NAME, $2 attention"
  due "$label" 240 || return
  ours env DTRUN_CUDA_ATTENTION="$att" "$DT" --standalone --nproc_per_node 1 "$D/gpt2.json" \
    train_steps="$G2STEPS" log.dir="$L/$name" >"$L/$name.log" 2>&1
  local rc=$?
  local r; r=$(python3 - "$L/$name/metrics.jsonl" "$G2WARM" "$rc" <<'PY'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
    timed = [r for r in rows if r["step"] > int(sys.argv[2])]
    tok = sum(r["tokens_per_s"] for r in timed) / len(timed)
    mfu = sum(r.get("mfu", 0) for r in timed) / len(timed)
    print(f"PASS {tok:.0f} {tok:.0f} tok/s, MFU {100 * mfu:.1f}% (steps {timed[0]['step']}..{timed[-1]['step']})")
except Exception as e:
    print(f"FAIL 0 exit {sys.argv[3]}: {e}")
PY
)
  set -- $r
  ours=$2
  if [ "$1" = PASS ]; then row "$label" PASS "${*:3}"
  else row "$label" FAIL "exit $rc: $(tail -2 "$L/$name.log" | clip 140)"; fi
}
memory() {
  local name="peak GPU memory vs dtrun plan (10%)"
  due "$name" 60 || return
  ours "$DT" plan "$D/gpt2.json" --gpus 1 --gpu h200 --strategy zero1 --json >"$L/plan.json" 2>"$L/plan.err"
  local r; r=$(python3 - "$L/gpt2_cublas/summary.json" "$L/plan.json" "$EMU" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))["ranks"][0]
    p = json.load(open(sys.argv[2]))["rows"][0]["memory_bytes"]["total"]
except Exception as e:
    print(f"FAIL {e}")
    sys.exit(0)
peak, acc = s["peak_bytes"], s["model_state_bytes"]["total"] + s["activation_bytes"]
if sys.argv[3] == "1":  # tiny model: the fixed 32 MiB cuBLAS workspace is most of the peak
    d = (acc - p) / p
    print(f"{'PASS' if abs(d) <= 0.1 else 'FAIL'} emulator, tiny model: model states + activations "
          f"{acc} B vs plan {p} B ({100 * d:+.1f}%); peak {peak} B: + {peak - acc} B of workspace, "
          f"scratch, staging and data, the most at this size")
else:
    d = (peak - p) / p
    print(f"{'PASS' if abs(d) <= 0.1 else 'FAIL'} peak {peak / 2**30:.2f} GiB vs plan {p / 2**30:.2f} GiB "
          f"({100 * d:+.1f}%); model states + activations {acc / 2**30:.2f} GiB, "
          f"the rest (workspace, scratch, staging, data) {(peak - acc) / 2**30:.2f} GiB")
PY
)
  row "$name" "${r%% *}" "${r#* }"
}
gpt2 gpt2_cublas cublas
cublas_tok=${ours:-}
memory
gpt2 gpt2_fused fused
if [ "$EMU" = 1 ]; then
  row "PyTorch torch.compile, same model, ratio" SKIP "the emulator run has no GPU for PyTorch"
elif due "PyTorch torch.compile, same model, ratio" 240; then
  # the image's python3, its own libraries: no LD_LIBRARY_PATH
  timeout -k 5 "$TO" python3 scripts/bench/gpu_torch_gpt2.py --batch "$B" --steps 30 --warmup 10 >"$L/torch.log" 2>&1
  t=$(python3 -c 'import json,sys
l = [x for x in open(sys.argv[1]) if x.startswith("{")]
d = json.loads(l[-1])
print(f"{d[\"tokens_per_s\"]:.0f} {100 * (d[\"mfu\"] or 0):.1f} {d[\"peak_mem_gb\"]:.1f}")' "$L/torch.log" 2>/dev/null)
  if [ -n "$t" ]; then
    set -- $t
    ratio=$(python3 -c "print(f'{${cublas_tok:-0} / $1:.2f}')" 2>/dev/null)
    row "PyTorch torch.compile, same model, ratio" PASS "$1 tok/s, MFU $2%, peak $3 GB; dtrun (cuBLAS attention)/torch ${ratio}x"
  else row "PyTorch torch.compile, same model, ratio" FAIL "$(tail -2 "$L/torch.log" | clip)"; fi
fi

# --- out of memory before it happens, on the GPU ------------------------------------
# A GPT whose micro-batch needs more than the GPU's whole memory (by `dtrun plan`:
# the smallest power of two over 1.25x memory.total; on the emulator a 0.04 GiB
# GPU, DTRUN_CUEMU_MEM_GB): the worker refuses it before the first step, exit 2
# naming the GPU's free memory and the cheapest change that fits; that change then
# trains a step in the same memory.
memcheck() {
  local name="memory check on the GPU: refused, suggestion fits"
  due "$name" 120 || return
  local menv=() shape total
  if [ "$EMU" = 1 ]; then
    menv=(DTRUN_CUEMU_MEM_GB=0.04)
    total=$(python3 -c 'print(int(0.04 * 2**30))')
    shape='"n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 16'
  else
    total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
    total=$(( ${total:-0} * 1024 * 1024 ))
    # 40 MB of activations per sequence, 82 flop per byte of them: the suggestion's
    # step (the same global batch) is a few seconds; no tensor over 2^31 elements
    shape='"n_layer": 8, "n_head": 8, "n_embd": 128, "seq_len": 256'
  fi
  if [ "$total" -le 0 ]; then row "$name" FAIL "no memory.total from nvidia-smi"; return; fi
  cat >"$D/oom.json" <<JSON
{"model": {"type": "gpt", $shape, "vocab_size": 256}, "device": "cuda",
 "data": {"train": "$D/text.txt", "val_fraction": 0.01},
 "train_micro_batch_size_per_gpu": 1, "train_steps": 1, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "seed": 3, "threads": $th,
 "eval": {"every_steps": 0}, "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
  local p1 p2 mb
  p1=$(ours "$DT" plan "$D/oom.json" train_micro_batch_size_per_gpu=1 --gpus 1 --gpu h200 --json 2>"$L/oom_plan.err")
  p2=$(ours "$DT" plan "$D/oom.json" train_micro_batch_size_per_gpu=2 --gpus 1 --gpu h200 --json 2>>"$L/oom_plan.err")
  mb=$(python3 -c 'import json, sys
t1, t2 = (json.loads(s)["rows"][0]["memory_bytes"]["total"] for s in sys.argv[1:3])
need, mb = 1.25 * int(sys.argv[3]), 1
while t1 + (mb - 1) * (t2 - t1) <= need: mb *= 2
print(mb, f"{(t1 + (mb - 1) * (t2 - t1)) / 1e9:.2f}")' "$p1" "$p2" "$total" 2>>"$L/oom_plan.err")
  if [ -z "$mb" ]; then row "$name" FAIL "sizing from dtrun plan: $(tail -2 "$L/oom_plan.err" | clip 140)"; return; fi
  set -- $mb
  mb=$1
  local plan_gb=$2 rc sug
  ours env "${menv[@]}" "$DT" --standalone --nproc_per_node 1 "$D/oom.json" train_micro_batch_size_per_gpu="$mb" \
    log.dir="$L/oom0" >"$L/oom0.log" 2>&1
  rc=$?
  sug=$(sed -n 's/.*the cheapest change that fits: \(.*\): [0-9.]* [kMG]*B per .*/\1/p' "$L/oom0.log" | head -1)
  local free; free=$(grep -o '([0-9.]* [kMG]*B free on GPU [0-9]* ([^)]*)' "$L/oom0.log" | head -1)
  local need; need=$(grep -o 'the run needs [0-9.]* [kMG]*B per GPU but [0-9.]* [kMG]*B is usable' "$L/oom0.log" |
    head -1 | sed 's/the run //; s/ per GPU but/,/')
  if [ $rc -ne 2 ] || [ -z "$free" ] || [ -z "$sug" ] || ! grep -q 'not enough memory: the run needs' "$L/oom0.log"; then
    row "$name" FAIL "micro-batch $mb (plan $plan_gb GB): exit $rc, not 2 naming 'free on GPU' and a change: $( (grep -a -m1 'not enough memory\|training failed' "$L/oom0.log" || tail -2 "$L/oom0.log") | clip 160)"
    return
  fi
  # shellcheck disable=SC2086
  ours env "${menv[@]}" "$DT" --standalone --nproc_per_node 1 "$D/oom.json" train_micro_batch_size_per_gpu="$mb" \
    $sug log.dir="$L/oom1" >"$L/oom1.log" 2>&1
  rc=$?
  local peak; peak=$(python3 -c 'import json, sys
print("%.3f" % (json.load(open(sys.argv[1]))["ranks"][0]["peak_bytes"] / 1e9))' "$L/oom1/summary.json" 2>/dev/null)
  if [ $rc -eq 0 ] && grep -q 'step 1/1' "$L/oom1.log"; then
    row "$name" PASS "micro-batch $mb: exit 2, $need (${free#(}); '$sug' trained 1 step, peak ${peak:-?} GB"
  else row "$name" FAIL "refused right, but '$sug' failed: exit $rc: $(tail -2 "$L/oom1.log" | clip 140)"; fi
}
memcheck

# --- checkpoint.async on the GPU: pinned staging, the same bytes ----------------------
# The small GPT (bf16) saved every steps/4 synchronously and with checkpoint.async
# (the shard copied from the GPU into pinned host memory, written by a thread): the
# same step folders and shard bytes (meta.json equal but for the save time, the run
# id and the folders), and summary.json's ckpt_blocked_ms against the synchronous save.
ckpt_async() {
  local name="checkpoint.async on the GPU = sync bytes"
  due "$name" 150 || return
  local every=$((steps / 4)) k=(device=cuda bf16.enabled=true checkpoint.keep_last=0)
  train ck_sync 1 "${k[@]}" checkpoint.every_steps=$every checkpoint.dir="$D/ck_sync"
  local rc0=$?
  train ck_async 1 "${k[@]}" checkpoint.every_steps=$every checkpoint.dir="$D/ck_async" checkpoint.async=true
  local rc1=$?
  if [ $rc0 -ne 0 ] || [ $rc1 -ne 0 ]; then
    row "$name" FAIL "exit $rc0 (sync), $rc1 (async): $(tail -2 "$L/ck_async.log" "$L/ck_sync.log" | grep -v '^==\|^$' | clip 140)"
    return
  fi
  local r; r=$(python3 - "$D/ck_sync" "$D/ck_async" "$L/ck_sync.log" "$L/ck_async/summary.json" \
    "$L/ck_sync/metrics.jsonl" "$L/ck_async/metrics.jsonl" <<'PY'
import json, os, re, sys
a, b, synclog, summ, ma, mb = sys.argv[1:7]
la = [json.loads(l)["loss"] for l in open(ma)]
lb = [json.loads(l)["loss"] for l in open(mb)]
diff = "" if la == lb else f" (the losses differ from step {next(i for i, (x, y) in enumerate(zip(la, lb)) if x != y) + 1}: not deterministic run to run?)"
sa, sb = sorted(os.listdir(a)), sorted(os.listdir(b))
if sa != sb:
    print(f"FAIL folders differ: {sa} vs {sb}{diff}"); sys.exit(0)
if open(f"{a}/latest").read() != open(f"{b}/latest").read():
    print(f"FAIL latest differs{diff}"); sys.exit(0)
n = 0
for d in sa:
    if not d.startswith("step_"): continue
    fa, fb = sorted(os.listdir(f"{a}/{d}")), sorted(os.listdir(f"{b}/{d}"))
    if fa != fb:
        print(f"FAIL {d}: files {fa} vs {fb}"); sys.exit(0)
    for f in fa:
        if f == "meta.json":
            m = [json.load(open(f"{x}/{d}/{f}")) for x in (a, b)]
            for x in m:
                x.pop("saved_at", None); x.pop("run_id", None); x["config"].pop("log", None)
                for k in ("dir", "async"): x["config"]["checkpoint"].pop(k, None)
            if m[0] != m[1]:
                print(f"FAIL {d}/meta.json differs beyond the save time, run id and folders"); sys.exit(0)
        elif open(f"{a}/{d}/{f}", "rb").read() != open(f"{b}/{d}/{f}", "rb").read():
            print(f"FAIL {d}/{f}: different bytes{diff}"); sys.exit(0)
        else:
            n += 1
s = json.load(open(summ))
if "ckpt_blocked_ms" not in s:
    print("FAIL summary.json has no ckpt_blocked_ms"); sys.exit(0)
sync = [float(x) * 1e3 for x in re.findall(r"\(every_steps\) saved to .* in ([0-9.]+) s", open(synclog).read())]
sync_ms = f"{sum(sync) / len(sync):.1f}" if sync else "?"
print(f"PASS {len([d for d in sa if d.startswith('step_')])} checkpoints, {n} shard files the same bytes; "
      f"{s['ckpt_async_saves']} async saves blocked {s['ckpt_blocked_ms']:.1f} ms each "
      f"(write {s['ckpt_write_ms']:.1f} ms in the background) vs a sync save {sync_ms} ms")
PY
)
  row "$name" "${r%% *}" "${r#* }"
}
ckpt_async

# --- bench comm over shm, racecheck -----------------------------------------------
[ "$EMU" = 1 ] && max=4M || max=64M
bench "bench comm --device cuda, 2 ranks share GPU, shm" 2 --backend shm --max "$max"
# --- dtrun check: the GPU's health through NVML, the communicator's health check -----
name="dtrun check: NVML health, comm health check (2 ranks, 1 GPU)"
if due "$name" 60; then
  ours timeout "$TO" "$DT" check --nproc_per_node 2 >"$L/check.out" 2>"$L/check.err"; rc=$?
  g=$(awk '$1 == "0" {sub(/.*(ok|LOW)  +/, ""); print}' "$L/check.out" | tail -1)
  h=$(grep -o 'all-reduce of .*' "$L/check.err" | head -1)
  if [ $rc -eq 0 ] && [ -n "$h" ]; then row "$name" PASS "gpus: ${g:-?}; $h"
  else row "$name" FAIL "exit $rc: gpus ${g:-?}; $(tail -2 "$L/check.err" | clip 160)"; fi
fi
name="compute-sanitizer racecheck, fused attention"
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ "$EMU" = 1 ]; then row "$name" SKIP "the emulator has no compute-sanitizer"
elif [ -z "$san" ]; then row "$name" SKIP "no compute-sanitizer on this machine"
elif due "$name" 300; then
  ours "$san" --tool racecheck --target-processes all --error-exitcode 9 "$BIN/test_attention_fused" --jobs 1 \
    >"$L/racecheck.log" 2>&1
  rc=$?
  summary=$(grep -aE 'RACECHECK SUMMARY|ERROR SUMMARY' "$L/racecheck.log" | sort | uniq -c | clip)
  if grep -q 'Device not supported' "$L/racecheck.log"; then row "$name" SKIP "compute-sanitizer: Device not supported here"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then row "$name" SKIP "deadline: stopped after ${TO}s; $summary"
  elif [ $rc -eq 0 ]; then row "$name" PASS "${summary:-no hazards}"
  else row "$name" FAIL "exit $rc: ${summary:-$(tail -2 "$L/racecheck.log" | clip)}"; fi
fi
exit $((NFAIL > 0))
