#!/usr/bin/env bash
# test_cuda_lib.sh - CUDA is a library loaded on demand (common/cudalib.c): dtrun
# links no CUDA library and libdtrun_cuda.so does; the agent and CPU workers of
# a real run map none of them (read from /proc/<pid>/maps while it runs); with
# the CUDA libraries hidden (a mount namespace: empty folders bound over every
# folder the loader could find them in) dtrun still starts and trains on the CPU,
# and device=cuda is exit 2 with one message naming the missing library and
# where it looked; the same with the CUDA library itself moved away, and a stale
# library (built against another kernels.h) is refused by name; dtrun-emu's
# agent does not map its emulated CUDA library while its GPU worker does.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BINDIR=$(dirname "$DTRUN")
PLUGIN=$BINDIR/libdtrun_cuda.so
CUDA_RE='libcudart|libcublas|libnccl|libdtrun_cuda'

make_text "$DT_TMP/text.txt" 5 3000
# small GPT on the CPU; KEY=VALUE overrides of the demo preset
SMALL=(data.train="$DT_TMP/text.txt" model.n_layer=1 model.n_head=2 model.n_embd=32 model.seq_len=16
       train_micro_batch_size_per_gpu=4 threads=1 eval.every_steps=0 checkpoint.every_steps=0
       checkpoint.resume=never)

# ---- what is linked ----------------------------------------------------------------
if [ -f "$PLUGIN" ]; then
  if ldd "$DTRUN" | grep -Eq 'libcudart|libcublas|libnccl'; then
    fail "ldd dtrun lists no CUDA library" "$(ldd "$DTRUN" | grep -E 'libcudart|libcublas|libnccl')"
  else pass "ldd dtrun lists no CUDA library (libcudart, libcublas, libnccl)"; fi
  missing=""
  for l in libcudart libcublasLt libcublas libnccl; do
    ldd "$PLUGIN" | grep -q "$l\.so.* => /" || missing="$missing $l"
  done
  [ -z "$missing" ] && pass "ldd libdtrun_cuda.so finds libcudart, libcublasLt, libcublas, libnccl" ||
    fail "ldd libdtrun_cuda.so finds the CUDA libraries" "missing:$missing"
  "$DTRUN" --version | grep -q "cuda: $PLUGIN" && pass "--version names the CUDA library beside dtrun" ||
    fail "--version names the CUDA library" "$("$DTRUN" --version)"
else
  skip "ldd dtrun / libdtrun_cuda.so" "no $PLUGIN (built without nvcc, or SAN=1)"
fi

# ---- nothing CUDA mapped in a CPU run ------------------------------------------------
# --exec: the agent's maps read by its child, the script's own maps as a contrast
"$DTRUN" --standalone --nproc_per_node 2 --exec sh -c \
  'cat /proc/$PPID/maps >"'"$DT_TMP"'/agent_exec.maps.$LOCAL_RANK"' >"$DT_TMP/exec.out" 2>&1
if [ -s "$DT_TMP/agent_exec.maps.0" ] && grep -q "$(basename "$DTRUN")" "$DT_TMP/agent_exec.maps.0"; then
  grep -Eq "$CUDA_RE" "$DT_TMP"/agent_exec.maps.* &&
    fail "the agent (--exec) maps no CUDA library" "$(grep -Eh "$CUDA_RE" "$DT_TMP"/agent_exec.maps.* | head -3)" ||
    pass "the agent (--exec) maps no CUDA library"
else fail "the agent's maps read through --exec" "$(tail -3 "$DT_TMP/exec.out")"; fi

# maps_during NAME BIN ENV... -- KEY=VALUE...: starts a 2-rank training in the
# background, and once its metrics show a step (the device is open) copies the maps
# of the agent and of each worker to $DT_TMP/NAME.{agent,worker.PID}.maps.
maps_during() {
  local name=$1 bin=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" "$bin" --standalone --nproc_per_node 2 "$ROOT/configs/demo.json" "${SMALL[@]}" \
    train_steps=100000 steps_per_print=1 log.dir="$DT_TMP/$name" "$@" >"$DT_TMP/$name.out" 2>&1 &
  local agent=$! i # env execs the agent: this is its pid
  for i in $(seq 1 300); do
    [ -s "$DT_TMP/$name/metrics.jsonl" ] && break
    kill -0 $agent 2>/dev/null || break
    sleep 0.1
  done
  cp /proc/$agent/maps "$DT_TMP/$name.agent.maps" 2>/dev/null
  for w in $(pgrep -P $agent); do cp /proc/$w/maps "$DT_TMP/$name.worker.$w.maps" 2>/dev/null; done
  kill -TERM $agent 2>/dev/null; wait $agent 2>/dev/null
}
maps_during cpu "$DTRUN" CUDA_VISIBLE_DEVICES= -- device=auto
nw=$(ls "$DT_TMP"/cpu.worker.*.maps 2>/dev/null | wc -l)
if [ -s "$DT_TMP/cpu.agent.maps" ] && [ "$nw" -eq 2 ]; then
  grep -Eq "$CUDA_RE" "$DT_TMP/cpu.agent.maps" && fail "the agent of a training run maps no CUDA library" ||
    pass "the agent of a training run maps no CUDA library"
  grep -Eq "$CUDA_RE" "$DT_TMP"/cpu.worker.*.maps &&
    fail "CPU workers (device auto, no GPU) map no CUDA library" "$(grep -Eh "$CUDA_RE" "$DT_TMP"/cpu.worker.*.maps | head -2)" ||
    pass "CPU workers (device auto, no GPU) map no CUDA library, during training"
else fail "maps of a CPU training run" "agent maps: $(wc -c <"$DT_TMP/cpu.agent.maps" 2>/dev/null), workers: $nw; $(tail -3 "$DT_TMP/cpu.out")"; fi

# ---- the emulator: its workers load the emulated CUDA library, its agent does not ---
EMU=${DTRUN_EMU:-$ROOT/dtrun-emu}
if [ -x "$EMU" ] && [ "${SAN:-0}" != 1 ]; then
  maps_during emu "$EMU" DTRUN_CUEMU_GPUS=1 -- device=cuda bf16.enabled=false
  nw=$(ls "$DT_TMP"/emu.worker.*.maps 2>/dev/null | wc -l)
  if [ -s "$DT_TMP/emu.agent.maps" ] && [ "$nw" -eq 2 ]; then
    grep -q libdtrun_cuda_emu "$DT_TMP/emu.agent.maps" && fail "dtrun-emu's agent does not map its CUDA library" ||
      pass "dtrun-emu's agent does not map its CUDA library"
    [ "$(grep -l libdtrun_cuda_emu "$DT_TMP"/emu.worker.*.maps | wc -l)" -eq 2 ] &&
      pass "dtrun-emu's GPU workers dlopen libdtrun_cuda_emu.so" ||
      fail "dtrun-emu's GPU workers dlopen libdtrun_cuda_emu.so"
  else fail "maps of a dtrun-emu training run" "workers: $nw; $(tail -3 "$DT_TMP/emu.out")"; fi
else
  skip "dtrun-emu loads its CUDA library on demand" "SAN=1, or no $EMU (the emulator build is not part of SAN runs)"
fi

# Test binaries that link the CUDA code in: the loader takes the symbols of the
# process (its first choice), so the emulator's op tests run rather than skip.
T=$ROOT/build-emu/tests/gpu/test_kernels_cuda
if [ -x "$T" ] && [ "${SAN:-0}" != 1 ]; then
  syn=$("$T" --filter 'cuda_device/*' 2>&1 | grep -a Synthesis)
  n=$(printf '%s' "$syn" | sed -n 's/.*Tested: \([0-9]*\).*/\1/p')
  [ "${n:-0}" -gt 0 ] && pass "linked-in CUDA code is found in the process (emu/test_kernels_cuda: $n device tests run)" ||
    fail "linked-in CUDA code is found in the process" "$syn"
else
  skip "linked-in CUDA code is found in the process" "SAN=1, or no $T (the emulator build)"
fi

# ---- the CUDA library moved away ------------------------------------------------------
mkdir -p "$DT_TMP/bin"
cp "$DTRUN" "$DT_TMP/bin/dtrun"
"$DT_TMP/bin/dtrun" --version | grep -q "cpu-only (no libdtrun_cuda.so" && pass "--version without the library says cpu-only" ||
  fail "--version without the library" "$("$DT_TMP/bin/dtrun" --version)"
CUDA_VISIBLE_DEVICES=0 timeout 60 "$DT_TMP/bin/dtrun" --standalone --nproc_per_node 1 "$ROOT/configs/demo.json" \
  "${SMALL[@]}" device=cuda train_steps=2 log.dir="$DT_TMP/moved" >"$DT_TMP/moved.out" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "libdtrun_cuda.so was not found: looked in $DT_TMP/bin" "$DT_TMP/moved.out" &&
   ! grep -q '^\[rank' "$DT_TMP/moved.out"; then
  pass "device=cuda without libdtrun_cuda.so: exit 2 before any worker, naming it and where it looked"
else fail "device=cuda without libdtrun_cuda.so" "exit $rc: $(grep -v '^\*\|OMP_NUM' "$DT_TMP/moved.out" | head -4)"; fi

# device auto on a node with a GPU (CUDA_VISIBLE_DEVICES=0 says there is one) needs
# the library too: caught by the agent as well
CUDA_VISIBLE_DEVICES=0 timeout 60 "$DT_TMP/bin/dtrun" --standalone --nproc_per_node 1 "$ROOT/configs/demo.json" \
  "${SMALL[@]}" device=auto train_steps=2 log.dir="$DT_TMP/moved_auto" >"$DT_TMP/moved_auto.out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "libdtrun_cuda.so was not found" "$DT_TMP/moved_auto.out" && ! grep -q '^\[rank' "$DT_TMP/moved_auto.out" &&
  pass "device=auto with a GPU and no libdtrun_cuda.so: exit 2 before any worker" ||
  fail "device=auto with a GPU and no libdtrun_cuda.so" "exit $rc: $(grep -v '^\*\|OMP_NUM' "$DT_TMP/moved_auto.out" | head -3)"
CUDA_VISIBLE_DEVICES= timeout 60 "$DT_TMP/bin/dtrun" --standalone --nproc_per_node 1 "$ROOT/configs/demo.json" \
  "${SMALL[@]}" device=auto train_steps=2 log.dir="$DT_TMP/moved_cpu" >"$DT_TMP/moved_cpu.out" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(wc -l <"$DT_TMP/moved_cpu/metrics.jsonl")" -ge 1 ] &&
  pass "device=auto without a GPU trains on the CPU with no CUDA library at all" ||
  fail "device=auto without a GPU, no CUDA library" "exit $rc: $(tail -3 "$DT_TMP/moved_cpu.out")"

# ---- a CUDA library built against another kernels.h ----------------------------------
# A stand-in library with this dtrun's ABI number but another DT_KERNELS_LAYOUT (what
# a stale libdtrun_cuda.so beside a rebuilt dtrun would carry): refused by name
# before any worker starts, instead of calling into it through the wrong offsets.
mkdir -p "$DT_TMP/stale"
cp "$DTRUN" "$DT_TMP/stale/dtrun"
cat >"$DT_TMP/stale.c" <<'C'
#include "common/cudalib.h"
#include "kernels/kernels.h"
const int dt_cudalib_abi = DT_CUDALIB_ABI;
const unsigned long dt_cuda_kernels_layout = DT_KERNELS_LAYOUT + 8;
C
if cc -shared -fPIC -I"$ROOT" "$DT_TMP/stale.c" -o "$DT_TMP/stale/libdtrun_cuda.so" 2>"$DT_TMP/stale_cc.out"; then
  "$DT_TMP/stale/dtrun" __cuda_probe >"$DT_TMP/stale_probe.out" 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q "libdtrun_cuda.so was built against another kernels.h" "$DT_TMP/stale_probe.out" &&
    pass "a CUDA library built against another kernels.h is refused by name" ||
    fail "a stale CUDA library is refused" "exit $rc: $(cat "$DT_TMP/stale_probe.out")"
  CUDA_VISIBLE_DEVICES=0 timeout 60 "$DT_TMP/stale/dtrun" --standalone --nproc_per_node 1 "$ROOT/configs/demo.json" \
    "${SMALL[@]}" device=cuda train_steps=2 log.dir="$DT_TMP/stale_run" >"$DT_TMP/stale_run.out" 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q "another kernels.h" "$DT_TMP/stale_run.out" && ! grep -q '^\[rank' "$DT_TMP/stale_run.out" &&
    pass "device=cuda with a stale CUDA library: exit 2 before any worker" ||
    fail "device=cuda with a stale CUDA library" "exit $rc: $(grep -v '^\*\|OMP_NUM' "$DT_TMP/stale_run.out" | head -4)"
else fail "the stand-in CUDA library compiles" "$(cat "$DT_TMP/stale_cc.out")"; fi

# ---- the CUDA libraries hidden ------------------------------------------------------------
# In a private mount namespace: an empty folder over every folder that holds a CUDA
# library (ldconfig's, /usr/local/cuda's, PyTorch's nvidia/*/lib), so libcudart
# cannot be found anywhere the loader looks.
hidden() {
  cat >"$DT_TMP/hidden.sh" <<'SH'
set -u
empty=$(mktemp -d)
dirs=$( { ldconfig -p | grep -E 'libcudart|libcublas|libnccl' | awk '{print $NF}' | xargs -r -n1 dirname
          readlink -f /usr/local/cuda 2>/dev/null
          ls -d /usr/lib/python3*/*-packages/nvidia /usr/local/lib/python3*/*-packages/nvidia \
                "$HOME"/.local/lib/python3*/site-packages/nvidia \
                "${PYENV_ROOT:-$HOME/.pyenv}"/versions/*/lib/python3*/*-packages/nvidia \
                ${VIRTUAL_ENV:+"$VIRTUAL_ENV"/lib/python3*/*-packages/nvidia} \
                ${CONDA_PREFIX:+"$CONDA_PREFIX"/lib/python3*/*-packages/nvidia} 2>/dev/null; } | sort -u)
for d in $dirs; do [ -d "$d" ] && mount --bind "$empty" "$d"; done
for l in libcudart.so.13 libcudart.so.12 libnccl.so.2; do
  python3 -c 'import ctypes,sys; ctypes.CDLL(sys.argv[1])' "$l" 2>/dev/null && { echo "STILL VISIBLE: $l"; exit 99; }
done
"$@"
SH
  unshare -m --propagation private bash "$DT_TMP/hidden.sh" "$@"
}
if ! unshare -m --propagation private true 2>/dev/null; then
  skip "dtrun with the CUDA libraries hidden" "unshare -m is not permitted here (needs root or user namespaces)"
elif [ ! -f "$PLUGIN" ]; then
  skip "dtrun with the CUDA libraries hidden" "no $PLUGIN"
else
  hidden "$DTRUN" --version >"$DT_TMP/h_version.out" 2>&1
  rc=$?
  if [ $rc -eq 99 ]; then
    skip "dtrun with the CUDA libraries hidden" "$(cat "$DT_TMP/h_version.out") after hiding"
  else
    [ $rc -eq 0 ] && pass "CUDA hidden: dtrun --version starts" || fail "CUDA hidden: dtrun --version" "exit $rc: $(cat "$DT_TMP/h_version.out")"
    hidden timeout 120 "$DTRUN" --standalone --nproc_per_node 2 "$ROOT/configs/demo.json" "${SMALL[@]}" device=cpu \
      train_steps=3 steps_per_print=1 log.dir="$DT_TMP/h_cpu" >"$DT_TMP/h_cpu.out" 2>&1
    rc=$?
    [ $rc -eq 0 ] && [ "$(wc -l <"$DT_TMP/h_cpu/metrics.jsonl")" -eq 3 ] &&
      pass "CUDA hidden: the CPU demo config trains 3 steps on 2 ranks" ||
      fail "CUDA hidden: CPU training" "exit $rc: $(tail -4 "$DT_TMP/h_cpu.out")"
    CUDA_VISIBLE_DEVICES=0 hidden timeout 60 "$DTRUN" --standalone --nproc_per_node 1 "$ROOT/configs/demo.json" \
      "${SMALL[@]}" device=cuda train_steps=2 log.dir="$DT_TMP/h_cuda" >"$DT_TMP/h_cuda.out" 2>&1
    rc=$?
    if [ $rc -eq 2 ] && grep -q "needs libcudart.so.[0-9]*, which was not found: looked in the system's library path" \
         "$DT_TMP/h_cuda.out" && grep -q "PyTorch's CUDA folders (/usr/lib/python3\*" "$DT_TMP/h_cuda.out"; then
      pass "CUDA hidden: device=cuda is exit 2 naming libcudart and every place looked"
    else fail "CUDA hidden: device=cuda" "exit $rc: $(grep -v '^\*\|OMP_NUM' "$DT_TMP/h_cuda.out" | head -4)"; fi
  fi
fi
finish
