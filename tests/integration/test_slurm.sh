#!/usr/bin/env bash
# test_slurm.sh - scripts/slurm/train.sbatch under a faked SLURM: the variables a
# 2-node batch job gets (SLURM_JOB_ID, SLURM_NNODES, SLURM_JOB_NODELIST, ...; no
# slurmctld), and a fake `srun` and `scontrol` on PATH: srun starts one task per
# host of the node list with the per-task variables (SLURM_NODEID, SLURM_PROCID,
# SLURMD_NODENAME: loopback addresses 127.0.0.2 and .3 as host names), scontrol
# expands node lists and records requeues. The job trains; SIGUSR1 sent to every
# task as SLURM's --signal does saves and exits and the script requeues; the
# requeued run (same job id) resumes and ends with the uninterrupted run's losses.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
SB=$PWD/scripts/slurm/train.sbatch
F=$DT_TMP/fake
mkdir -p "$F/bin"

cat > "$F/bin/scontrol" <<'SH'
#!/usr/bin/env bash
# fake scontrol: `show hostnames LIST` (prefix[a-b,c]suffix forms), `requeue ID`.
case "$1" in
  show) [ "$2" = hostnames ] || exit 1
        python3 - "$3" <<'PY'
import re, sys
for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", sys.argv[1]):
    m = re.match(r"([^\[]*)\[([^\]]*)\](.*)", item)
    if not m: print(item); continue
    for part in m.group(2).split(","):
        a, _, b = part.partition("-")
        for n in range(int(a), int(b or a) + 1): print(f"{m.group(1)}{n:0{len(a)}d}{m.group(3)}")
PY
        ;;
  requeue) if [ -n "${FAKE_REQUEUE_FAIL:-}" ]; then echo "scontrol: error: Requested operation is presently disabled for job $2" >&2; exit 1; fi
           echo "requeue $2" >> "$FAKE_SLURM_DIR/requeued" ;;
  *) echo "fake scontrol: $*: not faked" >&2; exit 1 ;;
esac
SH
cat > "$F/bin/srun" <<'SH'
#!/usr/bin/env bash
# fake srun: one task per host of SLURM_JOB_NODELIST with the step's variables;
# the tasks' pids go to $FAKE_SLURM_DIR/tasks (for the test's "SLURM" signals),
# their exit codes to tasks_rc; exits with the largest task exit code.
while [ $# -gt 0 ]; do case $1 in --*) echo "$1" >> "$FAKE_SLURM_DIR/srun_flags"; shift ;; *) break ;; esac; done
mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
: > "$FAKE_SLURM_DIR/tasks"; : > "$FAKE_SLURM_DIR/tasks_rc"
pids=()
for i in "${!hosts[@]}"; do
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 SLURM_STEPID=0 SLURM_STEP_ID=0 SLURMD_NODENAME=${hosts[$i]} \
    SLURM_STEP_NODELIST=$SLURM_JOB_NODELIST SLURM_STEP_NUM_NODES=${#hosts[@]} SLURM_STEP_NUM_TASKS=${#hosts[@]} \
    SLURM_NTASKS=${#hosts[@]} "$@" &
  pids+=($!)
  echo $! >> "$FAKE_SLURM_DIR/tasks"
done
# as srun does: USR1, USR2 and TERM go on to the tasks
for s in USR1 USR2 TERM; do trap "kill -s $s ${pids[*]} 2>/dev/null" $s; done
rc=0
for p in "${pids[@]}"; do
  while :; do wait "$p"; r=$?; kill -0 "$p" 2>/dev/null || break; done
  echo $r >> "$FAKE_SLURM_DIR/tasks_rc"; [ $r -gt $rc ] && rc=$r
done
exit $rc
SH
chmod +x "$F/bin/scontrol" "$F/bin/srun"

make_text "$DT_TMP/text.txt" 1 4000
cat > "$DT_TMP/g.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$DT_TMP/text.txt"}, "train_micro_batch_size_per_gpu": 8, "train_steps": 300,
 "steps_per_print": 1, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "threads": 1, "seed": 5,
 "eval": {"every_steps": 0}, "checkpoint": {"dir": "$DT_TMP/ck0", "every_steps": 1000}, "log": {"dir": "$DT_TMP/log0"}}
JSON
# job ID [VAR=VALUE ...] COMMAND...: the batch script as sbatch starts it on the first node.
job() {
  local id=$1; shift
  timeout 120 env PATH="$F/bin:$PATH" FAKE_SLURM_DIR="$F" SLURM_JOB_ID=$id SLURM_JOBID=$id SLURM_JOB_NAME=dtrun \
    SLURM_NNODES=2 SLURM_JOB_NUM_NODES=2 SLURM_JOB_NODELIST="127.0.0.[2-3]" SLURM_NODELIST="127.0.0.[2-3]" \
    SLURM_NODEID=0 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=2 SLURM_TASKS_PER_NODE="1(x2)" \
    SLURM_SUBMIT_DIR="$PWD" SLURM_SUBMIT_HOST=localhost SLURMD_NODENAME=127.0.0.2 \
    DTRUN="$DTRUN" DTRUN_NPROC=1 DTRUN_PORT=$(free_port) DTRUN_LOG_DIR="$DT_TMP/dtrun-logs/job-$id" "$@"
}

# The job trains: two agents (one per fake node) through srun, 300 steps.
job 4101 bash "$SB" "$DT_TMP/g.json" > "$DT_TMP/j0" 2>&1
rc=$?
if [ $rc -eq 0 ] && [ "$(losses "$DT_TMP/log0" | tail -1 | cut -d' ' -f1)" = 300 ] &&
   grep -q "store 127.0.0.2:" "$DT_TMP/j0" && grep -q "rendezvous round 0: node 1 of 2, ranks 1-1 of 2" "$DT_TMP/j0" &&
   grep -q "^--ntasks-per-node=1" "$F/srun_flags"; then
  pass "faked 2-node SLURM job: one agent per node through srun, store on the first host, 300 steps"
else fail "faked SLURM job" "rc=$rc $(grep -v 'step [0-9]*/' "$DT_TMP/j0" | tail -4)"; fi

# SIGUSR1 to each task (SLURM's --signal=USR1@120) mid-run: a checkpoint, the
# agents exit 138 (one whose group stop from the other node arrives before its
# own signal exits 1: srun's largest code is still 138), the script requeues.
rm -f "$F/requeued"
job 4202 bash "$SB" "$DT_TMP/g.json" checkpoint.dir="$DT_TMP/ck1" log.dir="$DT_TMP/log1" > "$DT_TMP/j1" 2>&1 & jb=$!
deadline=$((SECONDS + 60))
while [ "$(cat "$DT_TMP/log1/metrics.jsonl" 2>/dev/null | wc -l)" -lt 40 ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
for p in $(cat "$F/tasks"); do kill -USR1 "$p"; done
wait $jb; rc=$?
stop=$(sed -n 's/.*checkpoint: step \([0-9]*\) (SIGUSR1) saved to.*/\1/p' "$DT_TMP/j1" | head -1)
if [ $rc -eq 75 ] && [ -n "$stop" ] && [ "$stop" -lt 300 ] && [ "$(sort -n "$F/tasks_rc" | tail -1)" = 138 ] && [ "$(cat "$F/requeued" 2>/dev/null)" = "requeue 4202" ] &&
   [ "$(cat "$DT_TMP/ck1/latest")" = "$(printf step_%08d "$stop")" ] &&
   grep -q "train.sbatch: stopped before the time limit after step $stop with a checkpoint saved" "$DT_TMP/j1" &&
   grep -q "train.sbatch: job 4202 requeued: the next segment resumes from the latest checkpoint (exit 75)" "$DT_TMP/j1"; then
  pass "SIGUSR1 to the tasks: checkpoint of step $stop saved, agents exit $(sort -n "$F/tasks_rc" | tr '\n' ' '), job requeued"
else fail "SIGUSR1 before the time limit" "rc=$rc stop=$stop requeued=$(cat "$F/requeued" 2>/dev/null) task rc $(cat "$F/tasks_rc") $(grep -v 'step [0-9]*/' "$DT_TMP/j1" | tail -4)"; fi

# The requeued job (same id, SLURM_RESTART_COUNT 1), the same command: resumes.
job 4202 SLURM_RESTART_COUNT=1 bash "$SB" "$DT_TMP/g.json" checkpoint.dir="$DT_TMP/ck1" log.dir="$DT_TMP/log1" \
  > "$DT_TMP/j2" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "restart count 1" "$DT_TMP/j2" && grep -q "train.sbatch: training finished" "$DT_TMP/j2" && grep -q "resumed from .*$(printf step_%08d "${stop:-0}")" "$DT_TMP/j2" &&
   cmp -s <(losses "$DT_TMP/log0") <(losses "$DT_TMP/log1"); then
  pass "requeued job resumes from step $stop and ends with the uninterrupted run's losses"
else fail "requeued job" "rc=$rc $(grep -i 'resum\|error' "$DT_TMP/j2" | head -3)"; fi

# SIGUSR1 to the batch shell only (--signal=B:USR1@N, scancel -b): passed on to the
# agents; the requeue refused (--no-requeue): exit 79 and "NOT finished", never 0.
job 4404 FAKE_REQUEUE_FAIL=1 bash "$SB" "$DT_TMP/g.json" checkpoint.dir="$DT_TMP/ck4" log.dir="$DT_TMP/log4" \
  > "$DT_TMP/j4" 2>&1 & jb=$!
deadline=$((SECONDS + 60))
while [ "$(cat "$DT_TMP/log4/metrics.jsonl" 2>/dev/null | wc -l)" -lt 40 ] && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
pkill -USR1 -f "^bash $SB $DT_TMP/g.json checkpoint.dir=$DT_TMP/ck4" # the batch shell, not timeout
wait $jb; rc=$?
if [ $rc -eq 79 ] && grep -q "train.sbatch: got SIGUSR1: passing it to the agents" "$DT_TMP/j4" &&
   grep -q "train.sbatch: stopped before the time limit after step [0-9]* with a checkpoint saved" "$DT_TMP/j4" &&
   grep -q "requeue of job 4404 refused: scontrol: error: Requested operation is presently disabled.*NOT finished" "$DT_TMP/j4" &&
   [ -f "$DT_TMP/ck4/latest" ]; then
  pass "SIGUSR1 to the batch shell: passed on, saved; the requeue refused: exit 79, 'NOT finished'"
else fail "USR1 to the batch shell, requeue refused" "rc=$rc $(grep 'train.sbatch' "$DT_TMP/j4" | tail -3)"; fi

# Outside SLURM and without a config: clear errors, nothing started.
out=$(env -u SLURM_JOB_ID bash "$SB" "$DT_TMP/g.json" 2>&1); rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "SLURM_JOB_ID is unset"; then pass "outside a SLURM job: refused naming SLURM_JOB_ID"
else fail "outside SLURM" "rc=$rc $out"; fi
out=$(job 4303 bash "$SB" 2>&1); rc=$?
if [ $rc -eq 2 ] && echo "$out" | grep -q "usage: sbatch"; then pass "no config: usage, exit 2"
else fail "no config" "rc=$rc $out"; fi
[ -n "${KEEP_OUT:-}" ] && cp -r "$DT_TMP" "$KEEP_OUT"
finish
