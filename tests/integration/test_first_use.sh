#!/usr/bin/env bash
# test_first_use.sh - what a new user meets first (issue 32): `dtrun config` says
# valid exactly when the launcher starts the job, the messages of a first launch,
# the presets and paths the README names, the command line's help and typos.
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
T=$DT_TMP
cd "$T" # relative paths of the presets (runs/...) land here, not in the clone
ROOT=$OLDPWD

# --- dtrun config and the launcher give the same exit code for the same config and
# world size (config: --world-size N; launcher: --nproc_per_node N on one node)
make_text "$T/corpus.txt" 3 400
printf 'not a checkpoint\n' >"$T/notckpt"
# agree NAME WORLD WANT CONFIG KEY=VALUE...
agree() {
  local name=$1 ws=$2 want=$3; shift 3
  "$DTRUN" config "$@" --world-size "$ws" >"$T/$name.cfg.out" 2>"$T/$name.cfg.err"; local c=$?
  timeout 60 "$DTRUN" --standalone --nproc_per_node "$ws" "$@" log.dir="$T/log_$name" >"$T/$name.run.out" 2>&1; local l=$?
  if [ $c -eq "$want" ] && [ $l -eq "$want" ]; then pass "config and launcher agree: $name (exit $want)"
  else fail "config and launcher agree: $name" "config $c, launcher $l, expected $want: $(head -c 400 "$T/$name.cfg.err") | $(tail -c 400 "$T/$name.run.out")"; fi
}
MLP=$ROOT/configs/mlp-tiny.json
agree mlp_ok 1 0 "$MLP" train_steps=2
agree mlp_ok_ws2 2 0 "$MLP" train_steps=2
agree mlp_batch_ws3 3 2 "$MLP" train_steps=2 train_batch_size=16 gradient_accumulation_steps=1
agree missing_train 1 2 "$ROOT/configs/demo.json" data.train="$T/absent.txt"
agree missing_glob_dir 1 2 "$ROOT/configs/demo.json" "data.train=$T/no/such/dir/*.bin"
agree gpt2_preset_no_data 1 2 "$ROOT/configs/gpt2-124m.json" device=cpu
agree resume_missing 1 2 "$MLP" checkpoint.resume="$T/absent_ckpt"
agree resume_not_ckpt 1 2 "$MLP" checkpoint.resume="$T/notckpt"
agree demo_text_ok 1 0 "$ROOT/configs/demo.json" data.train="$T/corpus.txt" train_steps=1 model.n_layer=1 \
  model.seq_len=16 train_micro_batch_size_per_gpu=2 eval.every_steps=0 checkpoint.every_steps=0 sample_tokens=0
if ls /dev/nvidia[0-9]* >/dev/null 2>&1; then skip "config and launcher agree: device cuda without a GPU" "a GPU is visible"
else
  agree cuda_no_gpu 1 2 "$MLP" device=cuda
  grep -qF "device cuda: no GPU is visible" "$T/cuda_no_gpu.cfg.err" && pass "dtrun config: device cuda without a GPU said" ||
    fail "dtrun config: device cuda without a GPU said" "$(cat "$T/cuda_no_gpu.cfg.err")"
fi
grep -qF "data.train: no file matches '$T/absent.txt'" "$T/missing_train.cfg.err" &&
  pass "dtrun config names the missing data.train" || fail "dtrun config names the missing data.train" "$(cat "$T/missing_train.cfg.err")"
# a glob whose folder does not exist matches nothing: said so, naming the key
grep -qF "data.train: no file matches '$T/no/such/dir/*.bin'" "$T/missing_glob_dir.cfg.err" &&
  pass "a glob in a missing folder: no file matches, with the key" ||
  fail "a glob in a missing folder: no file matches, with the key" "$(cat "$T/missing_glob_dir.cfg.err")"

# --- the command line: every subcommand's --help exits 0 and lists the README's flags
python3 "$ROOT/tests/integration/readme_flags.py" "$DTRUN" "$ROOT/README.md" >"$T/flags.out" 2>&1
while read -r verdict rest; do
  case $verdict in ok:) pass "help: $rest" ;; *) fail "help: $rest" ;; esac
done <"$T/flags.out"
[ -s "$T/flags.out" ] || fail "readme_flags.py printed nothing"
for c in plan sample export tokenize report trace config debug "debug dump" store "bench store" check; do
  # shellcheck disable=SC2086
  "$DTRUN" $c --help >"$T/help.out" 2>&1 && [ -s "$T/help.out" ] && pass "dtrun $c --help: exit 0" ||
    fail "dtrun $c --help: exit 0" "$(head -3 "$T/help.out")"
done

# a mistyped subcommand is not looked for as a config file
"$DTRUN" plna x.json >"$T/typo.out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -qF "unknown command 'plna', did you mean 'plan'?" "$T/typo.out" &&
  pass "dtrun plna: did you mean 'plan'? (exit 2)" || fail "dtrun plna" "exit $rc: $(cat "$T/typo.out")"
echo '{}' >"$T/plna"
"$DTRUN" plna >"$T/typo3.out" 2>&1
! grep -q "unknown command" "$T/typo3.out" && pass "an existing file named like a typo is a config" ||
  fail "an existing file named like a typo is a config" "$(cat "$T/typo3.out")"

# torchrun's habits: `dtrun train.py` names the --exec command; --exec -m; --no-python
"$DTRUN" --nproc_per_node 2 train.py --lr 0.1 >"$T/py.out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -qF "dtrun --nproc_per_node 2 --exec python3 train.py --lr 0.1" "$T/py.out" &&
  pass "dtrun train.py: exit 2 with the --exec command" || fail "dtrun train.py" "exit $rc: $(cat "$T/py.out")"
printf 'import os, sys\nprint("module rank", os.environ["RANK"], sys.argv[1])\n' >"$T/dtmod.py"
PYTHON=python3 timeout 60 "$DTRUN" --standalone --nproc_per_node 2 --exec -m dtmod hello >"$T/m.out" 2>&1; rc=$?
[ $rc -eq 0 ] && grep -qF "[rank1]:module rank 1 hello" "$T/m.out" && pass "--exec -m MODULE runs \$PYTHON -m MODULE" ||
  fail "--exec -m MODULE" "exit $rc: $(tail -5 "$T/m.out")"
timeout 60 "$DTRUN" --standalone --no-python --exec echo hi >"$T/np.out" 2>&1; rc=$?
[ $rc -eq 0 ] && grep -qF "[rank0]:hi" "$T/np.out" && ! grep -qi "warn" "$T/np.out" &&
  pass "--no-python --exec: accepted, no warning" || fail "--no-python --exec" "exit $rc: $(cat "$T/np.out")"
timeout 60 "$DTRUN" --standalone --no_python echo hi >"$T/np2.out" 2>&1; rc=$?
[ $rc -eq 0 ] && grep -qF "[rank0]:hi" "$T/np2.out" && pass "--no_python PROGRAM runs it as torchrun does" ||
  fail "--no_python PROGRAM" "exit $rc: $(cat "$T/np2.out")"

# --- every `dtrun plan` line of the README runs from a clone (the presets it names
# are shipped), exit 0
mkdir -p "$T/clone" && ln -s "$ROOT/configs" "$T/clone/configs"
mkdir -p "$T/bin" && ln -sf "$DTRUN" "$T/bin/dtrun"
n=0
while IFS= read -r line; do
  n=$((n + 1))
  (cd "$T/clone" && PATH="$T/bin:$PATH" bash -c "$line") >"$T/plan$n.out" 2>&1; rc=$?
  [ $rc -eq 0 ] && pass "README: $line" || fail "README: $line" "exit $rc: $(tail -3 "$T/plan$n.out")"
done < <(python3 "$ROOT/tests/integration/readme_lines.py" "$ROOT/README.md" plan)
[ $n -ge 5 ] && pass "README: $n dtrun plan lines found" || fail "README: dtrun plan lines found" "only $n"
# the Llama 3 presets have Hugging Face's shapes
for spec in "llama3-8b 4096 32 32 8 14336 128256" "llama3-70b 8192 80 64 8 28672 128256"; do
  set -- $spec
  got=$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["model"]; print(m["hidden_size"], m["num_hidden_layers"], m["num_attention_heads"], m["num_key_value_heads"], m["intermediate_size"], m["vocab_size"], m["rope_theta"])' "$ROOT/configs/$1.json")
  [ "$got" = "$2 $3 $4 $5 $6 $7 500000.0" ] && pass "configs/$1.json: Llama 3's shapes" || fail "configs/$1.json: Llama 3's shapes" "$got"
done

# --- the tokenize walkthrough: the vocabulary comes from the shards' header (the
# tokenizer's 1000 ids), so what the model samples decodes; a smaller
# model.vocab_size is refused before start naming both numbers and the file
TOK=$ROOT/tests/fixtures/tok/gpt2/tokenizer.json
make_text "$T/tok.txt" 5 300
"$DTRUN" tokenize --tokenizer "$TOK" "$T/tok.txt" -o "$T/tk" --val-tokens 1K >"$T/tok.out" 2>&1 &&
  grep -qF "(vocab 1000)" "$T/tok.out" && pass "tokenize with the shipped tokenizer" || fail "tokenize" "$(cat "$T/tok.out")"
TINY=(model.n_layer=1 model.n_head=2 model.n_embd=32 model.seq_len=16 train_micro_batch_size_per_gpu=2
      eval.every_steps=0 sample_tokens=0 train_steps=2 checkpoint.every_steps=2)
timeout 120 "$DTRUN" --standalone --nproc_per_node 1 "$ROOT/configs/demo.json" "data.train=$T/tk_train_*.bin" \
  "data.val=$T/tk_val_*.bin" checkpoint.dir="$T/tkck" log.dir="$T/tklog" "${TINY[@]}" >"$T/tktrain.out" 2>&1; rc=$?
[ $rc -eq 0 ] && pass "demo.json trains on the shards without model.vocab_size" || fail "train on shards" "exit $rc: $(tail -5 "$T/tktrain.out")"
v=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"]["vocab_size"])' "$T/tkck/step_00000002/meta.json" 2>&1)
[ "$v" = 1000 ] && pass "the model's vocabulary is the shards' header's (1000)" || fail "vocab from the header" "$v"
"$DTRUN" sample "$T/tkck" --tokenizer "$TOK" --prompt "Q: " --tokens 20 >"$T/tksample.out" 2>&1; rc=$?
[ $rc -eq 0 ] && pass "dtrun sample decodes with the same tokenizer" || fail "dtrun sample" "exit $rc: $(tail -3 "$T/tksample.out")"
agree vocab_mismatch 1 2 "$ROOT/configs/demo.json" "data.train=$T/tk_train_*.bin" model.vocab_size=256 "${TINY[@]}" \
  checkpoint.dir="$T/tkck2"
grep -qF "data.train: '$T/tk_train_000000.bin' was tokenized with a vocabulary of 1000 ids (its header) but model.vocab_size is 256" \
  "$T/vocab_mismatch.cfg.err" && pass "a model.vocab_size under the header's: both numbers and the file" ||
  fail "vocab mismatch message" "$(cat "$T/vocab_mismatch.cfg.err")"

# --- every path the README names in the repository exists in a clone, and neither
# it nor the scripts name a placeholder (path/to/...) or a machine's own /opt/... venv
python3 - "$ROOT" <<'PY' >"$T/paths.out" 2>&1 && pass "README: every repository path it names exists" || fail "README paths" "$(cat "$T/paths.out")"
import os, re, sys
root = sys.argv[1]
bad = []
for name in ["README.md"] + ["scripts/" + d + "/" + f for d in ("bench", "compat", "slurm")
                             if os.path.isdir(os.path.join(root, "scripts", d))
                             for f in sorted(os.listdir(os.path.join(root, "scripts", d)))]:
    text = open(os.path.join(root, name), errors="replace").read()
    for p in [] if name != "README.md" else re.findall(r"(?<![\w/.$-])((?:scripts|configs|tests|docs|runtime|cli|common|kernels|rendezvous)/[\w./-]*[\w])", text):
        if not os.path.exists(os.path.join(root, p)):
            bad.append(f"{name}: {p}")
    for p in re.findall(r"(path/to/[\w./-]+|/opt/[\w./-]+|\.\./shared/[\w./-]+)", text):
        bad.append(f"{name}: {p}")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY

# --- make install: DESTDIR and PREFIX honoured; the installed binary runs
nocuda=()
[ -f "$(dirname "$DTRUN")/libdtrun_cuda.so" ] || nocuda=(NO_CUDA=1) # the build's own mode, never switched
# SAN=0: under `make test SAN=1` the environment says SAN=1, and the plain build is what installs
make -s -C "$ROOT" SAN=0 "${nocuda[@]}" install DESTDIR="$T/inst" PREFIX=/opt/dtrun-test >"$T/install.out" 2>&1; rc=$?
v=$("$T/inst/opt/dtrun-test/bin/dtrun" --version 2>&1)
[ $rc -eq 0 ] && [[ $v == "dtrun "* ]] && pass "make install DESTDIR=... PREFIX=...: the installed dtrun runs ($v)" ||
  fail "make install" "exit $rc: $(tail -3 "$T/install.out") / $v"
if [ ${#nocuda[@]} -eq 0 ]; then
  [ -f "$T/inst/opt/dtrun-test/bin/libdtrun_cuda.so" ] && [[ $v == *"cuda: $T/inst/opt/dtrun-test/bin/libdtrun_cuda.so"* ]] &&
    pass "make install: the CUDA library beside the binary, found there" || fail "make install: CUDA library" "$v"
fi

# --- a worker's refusal (exit 2: here the memory check) is one clear line from the
# agent, not the flight recorder's dump and the torchrun-style failure summary
DTRUN_TEST_MEM_AVAILABLE=2000000 timeout 60 "$DTRUN" --standalone --nproc_per_node 2 "$MLP" \
  model.type=gpt model.n_layer=2 model.n_head=2 model.n_embd=32 model.seq_len=32 data.train="$T/corpus.txt" \
  train_micro_batch_size_per_gpu=8 log.dir="$T/memlog" >"$T/refuse.out" 2>&1; rc=$?
if [ $rc -eq 2 ] && [ "$(grep -c "^dtrun: error: rank [01] (.*) refused the job before training (exit 2; not restarted): .*not enough memory" "$T/refuse.out")" = 1 ] &&
   ! grep -q "Root Cause\|FAILED\|flight recorder" "$T/refuse.out"; then pass "a worker's exit 2: one line, no failure summary or flight dump"
else fail "a worker's exit 2: one line" "exit $rc: $(cat "$T/refuse.out")"; fi

# --- the run's folder without --log_dir honours TMPDIR
mkdir -p "$T/tmpd"
rd=$(TMPDIR="$T/tmpd" timeout 60 "$DTRUN" --standalone --nproc_per_node 1 --exec sh -c 'echo "$DTRUN_RUN_DIR"' 2>&1)
[[ $rd == "[rank0]:$T/tmpd/dtrun-run-"* ]] && pass "the run folder is under \$TMPDIR" || fail "run folder under TMPDIR" "$rd"

# --- a config warning is printed once (by the agent, not again by rank 0), and one
# from a KEY=VALUE override says it came from the command line
timeout 60 "$DTRUN" --standalone --nproc_per_node 1 "$MLP" train_steps=1 fp16.enabled=true log.dir="$T/wlog" >"$T/warn.out" 2>&1; rc=$?
n=$(grep -c "ignoring DeepSpeed keys that dtrun does not implement" "$T/warn.out")
[ $rc -eq 0 ] && [ "$n" = 1 ] && grep -qF "fp16.enabled=true (from the command line): ignoring DeepSpeed keys" "$T/warn.out" &&
  pass "a warning once, saying it came from the command line" || fail "a warning once" "exit $rc, $n times: $(cat "$T/warn.out")"

finish
