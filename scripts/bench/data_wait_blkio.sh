#!/usr/bin/env bash
# data_wait_blkio.sh - data wait per step with the shards on genuinely slow
# storage: an ext4 file system on a loop device whose reads are throttled by the
# cgroup v1 blkio controller (blkio.throttle.read_iops_device), page cache dropped
# before each run, so every sample is a real read from the throttled device.
# Runs the same training with data.prefetch 0, 1 and 2 and prints data_ms and
# step_ms per step (median after step 2) and the warnings rank 0 gave.
# Needs root, losetup, mkfs.ext4 and /sys/fs/cgroup/blkio (scripts/bench/data_wait.sh
# is the portable version, with a sleep in the reader instead).
#   scripts/bench/data_wait_blkio.sh [READ_IOPS] [STEPS]     (defaults 60, 12)
set -euo pipefail
cd "$(dirname "$0")/../.."
IOPS=${1:-60} STEPS=${2:-12}
DTRUN=${DTRUN:-./dtrun}
CG=/sys/fs/cgroup/blkio
[ "$(id -u)" = 0 ] && [ -w "$CG" ] || { echo "data_wait_blkio: needs root and $CG" >&2; exit 2; }
T=$(mktemp -d /tmp/dtrun-blkio.XXXXXX)
LOOP= MNT=$T/mnt GROUP=$CG/dtrun-bench-$$
cleanup() {
  [ -d "$GROUP" ] && rmdir "$GROUP" 2>/dev/null || true
  mountpoint -q "$MNT" && umount "$MNT" || true
  [ -n "$LOOP" ] && losetup -d "$LOOP" || true
  rm -rf "$T"
}
trap cleanup EXIT
truncate -s 512M "$T/disk.img"
LOOP=$(losetup -f --show "$T/disk.img")
mkfs.ext4 -q "$LOOP"
mkdir -p "$MNT" && mount "$LOOP" "$MNT"
# 64M tokens of a byte-level vocabulary (128 MB): random windows of it are read.
python3 - "$MNT/train_000000.bin" <<'PY'
import sys, numpy as np
n = 64 << 20
hdr = np.zeros(256, np.int32); hdr[:3] = (20240520, 1, n)
rng = np.random.default_rng(1)
with open(sys.argv[1], "wb") as f:
    f.write(hdr.tobytes())
    for _ in range(16):
        f.write(rng.integers(0, 256, n // 16, dtype=np.uint16).tobytes())
PY
sync
mkdir "$GROUP"
echo "$(stat -c '%Hr:%Lr' "$LOOP") $IOPS" \
  > "$GROUP/blkio.throttle.read_iops_device"
cat > "$T/c.json" <<JSON
{"model": {"type": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 128, "seq_len": 256, "vocab_size": 256},
 "data": {"train": "$MNT/train_*.bin", "val_fraction": 0}, "train_micro_batch_size_per_gpu": 8,
 "train_steps": $STEPS, "steps_per_print": 1, "eval": {"every_steps": 0}, "threads": 1, "seed": 3,
 "checkpoint": {"every_steps": 0, "resume": "never"}}
JSON
echo "slow storage: $LOOP throttled to $IOPS reads/s (blkio), 8 samples of 257 tokens per micro-batch"
for p in 0 1 2; do
  sync; echo 3 > /proc/sys/vm/drop_caches
  ( echo $BASHPID > "$GROUP/cgroup.procs"
    exec env DTRUN_DATA_SCAN_MB=0 "$DTRUN" __worker "$T/c.json" log.dir="$T/p$p" data.prefetch=$p ) >"$T/p$p.out" 2>&1 \
    || { cat "$T/p$p.out"; exit 1; }
  python3 scripts/bench/data_wait_report.py "$T/p$p/metrics.jsonl" "$p"
  grep "for data from" "$T/p$p.out" | sed 's/^/   /' || true
done
