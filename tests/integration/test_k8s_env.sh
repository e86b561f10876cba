#!/usr/bin/env bash
# test_k8s_env.sh - dtrun as scripts/k8s/*.yaml run it, with exactly the environment
# each controller gives every pod (issue 39), two pods as two processes on loopback
# addresses (127.0.0.2 and .3 as the pod IPs):
#   - PyTorchJob (Kubeflow training operator): MASTER_ADDR (the master pod's service
#     name), MASTER_PORT, WORLD_SIZE (pods), RANK (pod index), PYTHONUNBUFFERED; the
#     container's args as the yaml gives them, $(VAR) expanded as Kubernetes does;
#   - JobSet (Kubeflow Trainer v2): PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the
#     completion index), PET_MASTER_ADDR (<jobset>-node-0-0.<jobset>), PET_MASTER_PORT;
# both train to the end, world size 2. The service names resolve through an
# /etc/hosts bind-mounted in a mount namespace (root and unshare; skipped otherwise),
# and in the JobSet case pod 0's name appears only 3 s after pod 1 started (a headless
# service's record appears once its pod runs): pod 1 says it waits, then joins.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  skip "Kubernetes pod environments" "needs root and unshare -m (a private /etc/hosts for the service names)"
  finish
fi
python3 -c 'import yaml' 2>/dev/null || { skip "Kubernetes pod environments" "no PyYAML (scripts/install-deps.sh)"; finish; }
make_text "$DT_TMP/t.txt" 1 2000
cat > "$DT_TMP/train.json" <<JSON
{"model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "seq_len": 16, "vocab_size": 256},
 "data": {"train": "$DT_TMP/t.txt"}, "train_micro_batch_size_per_gpu": 4, "train_steps": 20, "threads": 1,
 "steps_per_print": 1, "checkpoint": {"dir": "$DT_TMP/ck", "every_steps": 0}, "log": {"dir": "$DT_TMP/log"}}
JSON

# pod_cmd YAML POD_INDEX: the pod's command line, one word per line, from the yaml
# (container command + args, /config/train.json and /ckpt as the test's), $(VAR)
# expanded from the environment as Kubernetes does.
pod_cmd() {
  python3 - "$1" "$DT_TMP" <<'PY'
import os, re, sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
if d["kind"] == "PyTorchJob":
    c = d["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
else:
    c = d["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
words = c.get("command", []) + c.get("args", [])
t = sys.argv[2]
for w in words:
    w = re.sub(r"\$\((\w+)\)", lambda m: os.environ.get(m.group(1), m.group(0)), w)
    w = w.replace("/config/train.json", t + "/train.json").replace("/ckpt/run1", t + "/ck")
    print(w)
PY
}
# the env the yaml sets literally (JobSet's PET_ values), as KEY=VALUE lines
pod_env() {
  python3 - "$1" <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
c = d["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
for e in c.get("env", []):
    if "value" in e: print(f"{e['name']}={e['value']}")
PY
}
# run_pods HOSTS_LINE DELAY NAME ENV_FN: in a private mount namespace, pod 1 then
# (DELAY s later, after HOSTS_LINE is added to /etc/hosts) pod 0; each pod's
# environment from ENV_FN INDEX; logs in $DT_TMP/NAME.<i>
run_pods() {
  cp /etc/hosts "$DT_TMP/hosts"
  [ "$2" = 0 ] && echo "$1" >> "$DT_TMP/hosts"
  export -f pod_cmd pod_env "$4"
  HOSTS_LINE=$1 DELAY=$2 NAME=$3 ENVFN=$4 YAML=$PWD/scripts/k8s/$3.yaml DT_TMP=$DT_TMP DTRUN=$DTRUN \
  unshare -m bash -c '
    mount --bind "$DT_TMP/hosts" /etc/hosts || exit 99
    for i in 1 0; do
      mapfile -t envs < <("$ENVFN" $i)
      mapfile -t cmd < <(env "${envs[@]}" bash -c "pod_cmd \"\$1\"" _ "$YAML")
      cmd[0]=$DTRUN
      timeout 120 env -i PATH="$PATH" HOME=/root DTRUN_WAIT_REPORT_S=1 "${envs[@]}" "${cmd[@]}" \
        >"$DT_TMP/$NAME.$i" 2>&1 &
      pids[$i]=$!
      if [ $i = 1 ] && [ "$DELAY" != 0 ]; then sleep "$DELAY"; echo "$HOSTS_LINE" >> "$DT_TMP/hosts"; fi
    done
    wait ${pids[0]}; r0=$?; wait ${pids[1]}; r1=$?
    echo "$r0 $r1" > "$DT_TMP/$NAME.rc"'
}

# PyTorchJob: the operator's variables; the master's service name resolves from the start
pyt_env() {
  local i=$1
  echo "MASTER_ADDR=dtrun-train-master-0"; echo "MASTER_PORT=$K8S_PORT"; echo "WORLD_SIZE=2"; echo "RANK=$i"
  echo "PYTHONUNBUFFERED=0"; echo "POD_IP=127.0.0.$((i + 2))"
}
export K8S_PORT=$(free_port)
run_pods "127.0.0.2 dtrun-train-master-0" 0 pytorchjob pyt_env
read -r r0 r1 < "$DT_TMP/pytorchjob.rc" 2>/dev/null
if [ "${r0:-x}" = 0 ] && [ "${r1:-x}" = 0 ] && [ "$(losses "$DT_TMP/log" | tail -1 | cut -d' ' -f1)" = 20 ] &&
   grep -q "rendezvous round 0: node 1 of 2" "$DT_TMP/pytorchjob.1"; then
  pass "PyTorchJob's pod environment and scripts/k8s/pytorchjob.yaml's args: 2 pods train 20 steps"
else fail "PyTorchJob" "rc $r0 $r1: $(tail -2 "$DT_TMP/pytorchjob.0") | $(tail -2 "$DT_TMP/pytorchjob.1")"; fi

# JobSet (Trainer v2): the PET_ variables; pod 0's name appears 3 s after pod 1 started
rm -rf "$DT_TMP/log" "$DT_TMP/ck"
jobset_env() {
  local i=$1
  pod_env "$PWD/scripts/k8s/jobset.yaml" | grep -v '^PET_NODE_RANK=\|^PET_MASTER_PORT=\|^PET_NNODES=\|^PET_NPROC_PER_NODE='
  echo "PET_NNODES=2"; echo "PET_NPROC_PER_NODE=1"; echo "PET_NODE_RANK=$i"; echo "PET_MASTER_PORT=$K8S_PORT"
  echo "POD_IP=127.0.0.$((i + 2))"; echo "JOB_COMPLETION_INDEX=$i"
}
export K8S_PORT=$(free_port)
master=$(pod_env scripts/k8s/jobset.yaml | sed -n 's/^PET_MASTER_ADDR=//p')
run_pods "127.0.0.2 $master" 3 jobset jobset_env
read -r r0 r1 < "$DT_TMP/jobset.rc" 2>/dev/null
n=$(grep -c "rendezvous host '$master' does not resolve yet" "$DT_TMP/jobset.1")
if [ "${r0:-x}" = 0 ] && [ "${r1:-x}" = 0 ] && [ "$(losses "$DT_TMP/log" | tail -1 | cut -d' ' -f1)" = 20 ] &&
   [ "$n" -ge 2 ] && grep -q "rendezvous host '$master' resolves now" "$DT_TMP/jobset.1"; then
  pass "JobSet's PET_ environment: pod 1 waits for $master to resolve ($n lines), then 2 pods train 20 steps"
else fail "JobSet" "rc $r0 $r1, $n lines: $(tail -2 "$DT_TMP/jobset.0") | $(tail -3 "$DT_TMP/jobset.1")"; fi
finish
