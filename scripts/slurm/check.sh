#!/usr/bin/env bash
# check.sh - scripts/slurm/train.sbatch and dtrun under a real SLURM on this machine:
# munge, slurmctld and three slurmd (`slurmd -N n1..n3`, nodes n1..n3 on the loopback
# addresses 127.0.0.2..4), Debian's slurm-wlm. Each case submits real jobs and checks
# what the job ends as (scontrol: JobState, ExitCode, Restarts), its output file and
# the training's losses, then prints one row:
#
#   scripts/slurm/check.sh [--keep]        (root; needs slurmctld, slurmd, munged)
#
# Without SLURM installed it prints SKIP and exits 0 (apt-get install slurm-wlm
# installs it). The host names n1..n3 are added to /etc/hosts (marked, removed at the
# end) when they do not resolve. Everything else lives in a temporary folder; the
# daemons are stopped at the end. .ci/run runs it after make test (a tier of its own:
# it takes minutes). Exit status: 0 when every row passes.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
DTRUN=${DTRUN:-$ROOT/dtrun}
KEEP=0; [ "${1:-}" = --keep ] && KEEP=1
for p in slurmctld slurmd munged sbatch scontrol srun salloc; do
  command -v $p >/dev/null 2>&1 || { echo "SKIP: real SLURM: $p is not installed (apt-get install slurm-wlm)"; exit 0; }
done
[ "$(id -u)" = 0 ] || { echo "SKIP: real SLURM: needs root (slurmd runs jobs as their user)"; exit 0; }
[ -x "$DTRUN" ] || { echo "FAIL: no dtrun at $DTRUN (make first)"; exit 1; }

D=$(mktemp -d /tmp/dtrun-slurm.XXXXXX)
chmod 755 "$D"
export SLURM_CONF=$D/slurm.conf
FAILS=0; ROWS=()
row() { ROWS+=("$(printf '%-5s %-52s %s' "$1" "$2" "$3")"); echo "$1: $2${3:+: $3}"; [ "$1" = FAIL ] && FAILS=$((FAILS + 1)); }
pass() { row PASS "$1" "${2:-}"; }
fail() { row FAIL "$1" "${2:-}"; }

cleanup() {
  scancel --full -u root >/dev/null 2>&1
  sleep 1
  for f in "$D"/slurmd-*.pid "$D"/slurmctld.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
  sleep 1
  pkill -f "slurmd -f $D/slurm.conf" 2>/dev/null; pkill -f "slurmctld -f $D/slurm.conf" 2>/dev/null
  [ -n "${HOSTS_ADDED:-}" ] && sed -i '/# dtrun-slurm-check$/d' /etc/hosts
  [ $KEEP = 1 ] && echo "kept: $D" || rm -rf "$D"
}
trap cleanup EXIT

# ---- the cluster: munge, slurmctld, three slurmd ----
if ! getent hosts n1 >/dev/null || ! getent hosts n3 >/dev/null; then
  printf '127.0.0.%d n%d # dtrun-slurm-check\n' 2 1 3 2 4 3 >> /etc/hosts
  HOSTS_ADDED=1
fi
[ "$(getent hosts n2 | awk '{print $1}')" = 127.0.0.3 ] || { echo "FAIL: n2 does not resolve to 127.0.0.3"; exit 1; }
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  [ -f /etc/munge/munge.key ] || mungekey -c 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1k count=1 2>/dev/null
  chown munge:munge /etc/munge/munge.key 2>/dev/null; chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null
  su -s /bin/sh munge -c /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force
  sleep 1
fi
munge -n | unmunge >/dev/null 2>&1 || { echo "FAIL: munge does not work"; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CP=$(free_port)
mkdir -p "$D/state" "$D/spool" "$D/log" "$D/work"
{
  echo "ClusterName=dtcheck"
  echo "SlurmctldHost=localhost(127.0.0.1)"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "StateSaveLocation=$D/state"
  echo "SlurmdSpoolDir=$D/spool/%n"
  echo "SlurmctldPidFile=$D/slurmctld.pid"
  echo "SlurmdPidFile=$D/slurmd-%n.pid"
  echo "SlurmctldPort=$CP"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/affinity"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_CPU"
  echo "SchedulerType=sched/backfill"
  echo "ReturnToService=2"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobCompType=jobcomp/none"
  echo "MpiDefault=none"
  echo "SlurmctldLogFile=$D/log/slurmctld.log"
  echo "SlurmdLogFile=$D/log/slurmd-%n.log"
  echo "KillWait=20"
  echo "MinJobAge=3600"
  echo "OverTimeLimit=0"
  for i in 1 2 3; do
    echo "NodeName=n$i NodeAddr=127.0.0.$((i + 1)) NodeHostname=n$i Port=$(free_port) CPUs=2 State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=n[1-3] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
} > "$SLURM_CONF"
slurmctld -c -f "$SLURM_CONF" || { echo "FAIL: slurmctld did not start"; exit 1; }
for i in 1 2 3; do slurmd -f "$SLURM_CONF" -N n$i || { echo "FAIL: slurmd n$i did not start"; exit 1; }; done
for _ in $(seq 60); do [ "$(sinfo -h -o %T -t idle | wc -l)" -ge 1 ] && [ "$(sinfo -h -N -o '%N %T' | grep -c idle)" = 3 ] && break; sleep 0.5; done
[ "$(sinfo -h -N -o '%N %T' | grep -c idle)" = 3 ] || { echo "FAIL: the 3 nodes are not idle: $(sinfo -N 2>&1)"; tail -5 "$D/log/slurmctld.log"; exit 1; }
echo "cluster: slurm $(sinfo -V | awk '{print $2}'), 3 nodes idle (n1..n3 on 127.0.0.2..4), $D"

# ---- the training and helpers ----
W=$D/work
python3 - "$W/text.txt" <<'PY'
import random, sys
random.seed(1)
w = "the quick brown fox jumps over a lazy dog while seven tired cats sleep".split()
open(sys.argv[1], "w").write("".join(" ".join(random.choice(w) for _ in range(random.randint(3, 9))) + ".\n" for _ in range(4000)))
PY
config() { # config NAME STEPS: a tiny GPT, its folders under $W/NAME
  cat > "$W/$1.json" <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "$W/text.txt"}, "train_micro_batch_size_per_gpu": 8, "train_steps": $2,
 "steps_per_print": 1, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "threads": 1, "seed": 5,
 "eval": {"every_steps": 0}, "checkpoint": {"dir": "$W/$1/ck", "every_steps": 1000}, "log": {"dir": "$W/$1/log"}}
JSON
}
losses() { python3 -c 'import json,sys; [print(json.loads(l)["step"], repr(json.loads(l)["loss"])) for l in open(sys.argv[1])]' "$1/metrics.jsonl" 2>/dev/null; }
nlines() { cat "$1" 2>/dev/null | wc -l; }
field() { scontrol show job "$1" -o 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
# done_job ID SECONDS: waits for the job to end for good (not requeued); prints STATE EXIT RESTARTS
done_job() {
  local s
  for _ in $(seq $(($2 * 4))); do
    s=$(field "$1" JobState)
    case $s in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED|BOOT_FAIL|DEADLINE) break ;; esac
    sleep 0.25
  done
  echo "$(field "$1" JobState) $(field "$1" ExitCode) $(field "$1" Restarts)"
}
# submitted from $W: the job's SLURM_SUBMIT_DIR, where train.sbatch puts dtrun-logs/
submit() { (cd "$W" && sbatch --parsable -o "$W/%j.out" "$@" | cut -d';' -f1); }
# release ID: a requeued job waits for its begin time (SLURM holds it about 2 minutes);
# start it now (what is checked is that it runs again and resumes, not SLURM's delay)
release() {
  for _ in $(seq 600); do grep -q "requeued" "$W/$1.out" 2>/dev/null && [ "$(field "$1" JobState)" = PENDING ] && break; sleep 0.1; done
  scontrol update JobId="$1" StartTime=now >/dev/null 2>&1
}
# at_step LOGDIR N SECONDS: waits until the run logged N steps
at_step() { for _ in $(seq $(($3 * 10))); do [ "$(nlines "$1/metrics.jsonl")" -ge "$2" ] && return 0; sleep 0.1; done; return 1; }
leftovers() { pgrep -f "$DTRUN" | grep -v "^$$\$" | wc -l; }
export DTRUN

# 1. 1 node and 3 nodes, to the end
config ref1 200
j=$(submit -N1 "$ROOT/scripts/slurm/train.sbatch" "$W/ref1.json")
r=$(done_job "$j" 120)
if [ "$r" = "COMPLETED 0:0 0" ] && grep -q "train.sbatch: training finished" "$W/$j.out" && [ "$(losses "$W/ref1/log" | tail -1 | cut -d' ' -f1)" = 200 ]; then
  pass "1 node: 200 steps, COMPLETED 0:0" "job $j"
else fail "1 node" "$r $(tail -3 "$W/$j.out")"; fi
config ref3 200
j=$(submit -N3 "$ROOT/scripts/slurm/train.sbatch" "$W/ref3.json")
r=$(done_job "$j" 180)
if [ "$r" = "COMPLETED 0:0 0" ] && [ "$(losses "$W/ref3/log" | tail -1 | cut -d' ' -f1)" = 200 ] &&
   grep -q "^2: .*rendezvous round 0: node 2 of 3" "$W/$j.out" && [ -d "$W/dtrun-logs/job-$j/segment-0/$j" ]; then
  pass "3 nodes: one agent per node, lines labelled by node, per-job log folder" "job $j"
else fail "3 nodes" "$r $(grep -v 'step [0-9]*/' "$W/$j.out" | tail -4)"; fi

# 2. USR1 to the steps (the time limit's --signal=USR1@N), to the batch shell
#    (--signal=B:USR1@N), and to both (scancel --full): requeued, resumed, the losses
#    of the uninterrupted 3-node run, Restarts 1, a folder per segment
for how in steps batch full; do
  config usr1-$how 200
  j=$(submit -N3 "$ROOT/scripts/slurm/train.sbatch" "$W/usr1-$how.json")
  at_step "$W/usr1-$how/log" 40 60
  case $how in
    steps) scancel -s USR1 "$j" ;;
    batch) scancel -b -s USR1 "$j" ;;
    full) scancel --full -s USR1 "$j" ;;
  esac
  release "$j"
  r=$(done_job "$j" 300)
  stop=$(sed -n 's/.*stopped before the time limit after step \([0-9]*\) with a checkpoint saved.*/\1/p' "$W/$j.out" | head -1)
  if [ "$r" = "COMPLETED 0:0 1" ] && [ -n "$stop" ] && grep -q "job $j requeued" "$W/$j.out" &&
     grep -q "resumed from .*$(printf step_%08d "$stop")" "$W/$j.out" &&
     cmp -s <(losses "$W/ref3/log") <(losses "$W/usr1-$how/log" | awk '!seen[$1]++') &&
     [ -d "$W/dtrun-logs/job-$j/segment-1" ]; then
    pass "USR1 ($how): saved at step $stop, requeued, resumed, losses exact" "job $j: $r"
  else fail "USR1 ($how)" "$r stop=$stop $(grep 'train.sbatch' "$W/$j.out" | tail -3)"; fi
done

# 3. a refused requeue (--no-requeue) is not a success
config noreq 300
j=$(submit -N2 --no-requeue "$ROOT/scripts/slurm/train.sbatch" "$W/noreq.json")
at_step "$W/noreq/log" 40 60
scancel -s USR1 "$j"
r=$(done_job "$j" 120)
if [ "${r% *}" = "FAILED 79:0" ] && grep -q "requeue of job $j refused" "$W/$j.out" && grep -q "NOT finished" "$W/$j.out"; then
  pass "--no-requeue then USR1: FAILED 79:0, says the training is not finished" "job $j"
else fail "--no-requeue then USR1" "$r $(grep 'train.sbatch' "$W/$j.out" | tail -2)"; fi

# 4. scancel (SIGTERM): the output keeps the last lines (the save), no process is left
config cancel 3000
j=$(submit -N2 "$ROOT/scripts/slurm/train.sbatch" "$W/cancel.json")
at_step "$W/cancel/log" 40 60
scancel "$j"
r=$(done_job "$j" 120)
sleep 2
left=$(leftovers)
if [ "${r%% *}" = CANCELLED ] && grep -q "checkpoint: step [0-9]* (SIGTERM) saved" "$W/$j.out" &&
   grep -q "train.sbatch: stopped by SIGTERM after step [0-9]* with a checkpoint saved" "$W/$j.out" && [ "$left" = 0 ]; then
  pass "scancel: the save and the script's last line in the output, no process left" "job $j: $r"
else fail "scancel" "$r left=$left $(tail -3 "$W/$j.out")"; fi

# 5. the time limit without USR1 (SIGTERM at the limit): saved, said, TIMEOUT
config tlimit 100000
j=$(submit -N2 --time=1 --signal=CONT@1 "$ROOT/scripts/slurm/train.sbatch" "$W/tlimit.json")
r=$(done_job "$j" 150)
if [ "${r%% *}" = TIMEOUT ] && grep -q "(SIGTERM) saved" "$W/$j.out" &&
   grep -q "train.sbatch: stopped by SIGTERM after step [0-9]* with a checkpoint saved" "$W/$j.out"; then
  pass "time limit (SIGTERM): saved and said before the end" "job $j: $r"
else fail "time limit" "$r $(tail -3 "$W/$j.out")"; fi

# 6. srun --ntasks-per-node=2 dtrun, salloc -N2 dtrun: refused, naming the fix
config twotask 50
out=$(salloc -N1 -n2 srun --ntasks-per-node=2 "$DTRUN" "$W/twotask.json" 2>&1); rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "srun started 2 tasks on 1 node(s)" && [ ! -e "$W/twotask/log/metrics.jsonl" ]; then
  pass "srun --ntasks-per-node=2 dtrun: refused before any training"
else fail "srun --ntasks-per-node=2" "rc=$rc $(echo "$out" | tail -2)"; fi
out=$(timeout 60 salloc -N2 "$DTRUN" "$W/twotask.json" 2>&1); rc=$?
if [ $rc -ne 0 ] && [ $rc != 124 ] && echo "$out" | grep -q "not a job step"; then
  pass "salloc -N2 dtrun (no srun): exit 2 at once, naming srun"
else fail "salloc -N2 dtrun" "rc=$rc $(echo "$out" | tail -2)"; fi

# 7. one node cannot start (its config refused): the job ends in seconds, naming it
config onebad 200
cat > "$W/dtrun-n2-bad" <<SH
#!/usr/bin/env bash
# dtrun, with a missing data file on n2 only
[ "\$SLURMD_NODENAME" = n2 ] && exec "$DTRUN" "\$@" data.train=$W/missing.txt
exec "$DTRUN" "\$@"
SH
chmod +x "$W/dtrun-n2-bad"
t0=$SECONDS
j=$(DTRUN=$W/dtrun-n2-bad submit -N2 "$ROOT/scripts/slurm/train.sbatch" "$W/onebad.json")
r=$(done_job "$j" 200)
took=$((SECONDS - t0))
if [ "${r%% *}" = FAILED ] && [ $took -lt 60 ] && grep -q "a node cannot start: node_rank 1 (n2): config .* is not valid" "$W/$j.out" &&
   grep -q "train.sbatch: dtrun exited 2: the training failed" "$W/$j.out"; then
  pass "one node's config refused: FAILED in ${took} s, node 0 names n2" "job $j: $r"
else fail "one node refused" "$r ${took}s $(grep -v 'step' "$W/$j.out" | tail -3)"; fi

# 8. srun -N2 -r1 in a 3-node allocation: the store on the step's first host
config rel 50
out=$(salloc -N3 srun -N2 -r1 --ntasks-per-node=1 bash -c 'exec "$0" --local_addr $SLURMD_NODENAME "$@"' \
      "$DTRUN" --nproc_per_node 1 "$W/rel.json" 2>&1); rc=$?
if [ $rc = 0 ] && echo "$out" | grep -q "store at n2:" && [ "$(losses "$W/rel/log" | tail -1 | cut -d' ' -f1)" = 50 ]; then
  pass "srun -N2 -r1: store on the step's first host (n2), trains"
else fail "srun -N2 -r1" "rc=$rc $(echo "$out" | grep -i 'store\|error' | head -3)"; fi

# 9. the job's cpuset: --nproc_per_node cpu in a 1-CPU step gives 1 worker
out=$(salloc -N1 -n1 -c1 srun -c1 --cpu-bind=cores "$DTRUN" --nproc_per_node cpu --exec sh -c 'echo "ws=$WORLD_SIZE"' 2>&1); rc=$?
if [ $rc = 0 ] && echo "$out" | grep -q "ws=1$" && ! echo "$out" | grep -q "ws=2" && echo "$out" | grep -q "cpu: 1 worker(s) per node"; then
  pass "--nproc_per_node cpu in a 1-CPU allocation: 1 worker"
else fail "cpuset" "rc=$rc $(echo "$out" | tail -3)"; fi

# 10. the derived port taken on the first node: the next free one
config port 50
jid_guess=$(( $(scontrol show config | sed -n 's/^NEXT_JOB_ID *= *//p') ))
port=$((15000 + jid_guess % 20000))
python3 -c 'import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.2", int(sys.argv[1]))); s.listen(); time.sleep(120)' "$port" & holder=$!
sleep 0.5
j=$(submit -N2 "$ROOT/scripts/slurm/train.sbatch" "$W/port.json")
r=$(done_job "$j" 120)
kill $holder 2>/dev/null
if [ "$j" = "$jid_guess" ] && [ "$r" = "COMPLETED 0:0 0" ] && grep -q "port $port on n1 is taken; trying $((port + 1))" "$W/$j.out"; then
  pass "the derived port taken on n1: the next one, trains" "job $j"
elif [ "$j" != "$jid_guess" ]; then fail "port taken" "the job id was $j, not $jid_guess"
else fail "port taken" "$r $(grep 'train.sbatch\|error' "$W/$j.out" | tail -3)"; fi

echo
echo "real SLURM ($(sinfo -V)), 3 nodes on one machine:"
for r in "${ROWS[@]}"; do echo "  $r"; done
echo "slurm check: ${#ROWS[@]} rows, $FAILS failed"
[ $FAILS = 0 ]
