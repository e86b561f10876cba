#!/usr/bin/env python3
"""data_wait_report.py METRICS_JSONL PREFETCH - one run's data_ms and step_ms per step
and their medians after step 2 (for data_wait.sh and data_wait_blkio.sh)."""
import json
import statistics
import sys

rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"data.prefetch {sys.argv[2]}: data_ms per step " + " ".join(f"{r['data_ms']:.1f}" for r in rows))
print("   step_ms per step " + " ".join(f"{r['step_ms']:.1f}" for r in rows))
print(f"   median after step 2: data_ms {statistics.median(r['data_ms'] for r in rows[2:]):.2f}, "
      f"step_ms {statistics.median(r['step_ms'] for r in rows[2:]):.1f}")
