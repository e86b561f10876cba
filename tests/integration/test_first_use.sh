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

finish
