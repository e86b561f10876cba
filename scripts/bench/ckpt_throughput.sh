#!/usr/bin/env bash
# ckpt_throughput.sh - checkpoint save/load throughput (demo model and GPT-2 124M,
# fp32 params + Adam m + v) against the disk's sequential write speed measured in
# the same run (dd with conv=fdatasync). Usage: scripts/bench/ckpt_throughput.sh [DIR]
# (DIR on the disk to measure, default /tmp; needs ~3 GB free).
set -eu
cd "$(dirname "$0")/../.."
make -s build/tests/helpers/bench_ckpt
B=build/tests/helpers/bench_ckpt
D=$(mktemp -d "${1:-/tmp}/dtrun-ckbench.XXXXXX")
trap 'rm -rf "$D"' EXIT
echo "disk: $(df -h "$D" | tail -1 | awk '{print $1}')"
dd if=/dev/zero of="$D/dd.bin" bs=16M count=64 conv=fdatasync 2>&1 | tail -1 | sed 's/^/dd 1 GiB, conv=fdatasync: /'
rm -f "$D/dd.bin"
echo "demo (configs/demo.json: 4 layers, 128 wide, vocab 256):"
$B "$D/demo" 4 4 128 128 256 1 1
$B "$D/demo2" 4 4 128 128 256 2 3
echo "GPT-2 124M (12 layers, 768 wide, vocab 50257):"
$B "$D/g1" 12 12 768 1024 50257 1 1
rm -rf "$D/g1"
$B "$D/g2" 12 12 768 1024 50257 2 3
