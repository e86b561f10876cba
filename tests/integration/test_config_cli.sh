#!/usr/bin/env bash
# test_config_cli.sh - `dtrun config`: exit 0 with the resolved JSON for good
# configs, exit 2 with every error (file, key path, expected, found) for bad ones.
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."
T=$DT_TMP

# run NAME WANT_RC ARGS...: runs dtrun config, keeps stdout/stderr in $T/NAME.{out,err}
run() {
  local name=$1 want=$2; shift 2
  "$DTRUN" config "$@" >"$T/$name.out" 2>"$T/$name.err"; local rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$name" "exit $rc, expected $want; stderr: $(head -c 600 "$T/$name.err")"
    return 1
  fi
}
# has NAME FILE TEXT: passes when FILE contains TEXT (fixed string)
has() { if grep -qF -- "$3" "$2"; then pass "$1"; else fail "$1" "no <$3> in: $(head -c 600 "$2")"; fi; }
# eq NAME GOT WANT
eq() { if [ "$2" = "$3" ]; then pass "$1"; else fail "$1" "got <$2>, expected <$3>"; fi; }
json_get() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval("d"+sys.argv[2]))' "$@"; }

# every preset is valid once its data is there (a clone has none; the CPU stands in
# for a GPU), and the output is JSON with the batch resolved
make_text "$T/corpus.txt" 7 3000
DATA=(data.train="$T/corpus.txt" data.val="$T/corpus.txt" device=cpu)
for f in configs/*.json; do
  n=$(basename "$f" .json)
  run "preset_$n" 0 "$f" "${DATA[@]}" &&
    eq "preset $n: exit 0, resolved JSON" "$(json_get "$T/preset_$n.out" '["train_micro_batch_size_per_gpu"] >= 1')" True
done
run demo_ws2 0 configs/demo.json --world-size 2 --print-config "${DATA[@]}" &&
  eq "demo at world size 2: train_batch_size 32" "$(json_get "$T/demo_ws2.out" '["train_batch_size"]')" 32

# the dump loads again and prints the same
run dump1 0 configs/gpt2-124m.json --world-size 4 "${DATA[@]}" && cp "$T/dump1.out" "$T/dump.json" &&
  run dump2 0 "$T/dump.json" --world-size 4 &&
  { cmp -s "$T/dump1.out" "$T/dump2.out" && pass "dump reloads to the same config" || fail "dump reloads to the same config"; }

# overrides
run ov 0 configs/demo.json "${DATA[@]}" model.n_layer=2 optimizer.params.lr=3e-4 strategy=fsdp && {
  eq "override model.n_layer" "$(json_get "$T/ov.out" '["model"]["n_layer"]')" 2
  eq "override optimizer.params.lr" "$(json_get "$T/ov.out" '["optimizer"]["params"]["lr"]')" 0.0003
  eq "override strategy sets the stage" "$(json_get "$T/ov.out" '["zero_optimization"]["stage"]')" 3
}
run ov_bad 2 configs/demo.json model.n_layr=2 && has "unknown override key: did you mean" "$T/ov_bad.err" \
  "override model.n_layr=2: model.n_layr: unknown key (did you mean model.n_layer?)"

# a missing file
run missing 2 "$T/nope.json" && has "missing file: exit 2 with the reason" "$T/missing.err" \
  "nope.json: expected a readable JSON file, found an error: No such file or directory"

# invalid JSON, with line and column
printf '{\n  "seed": 1,\n  "train_steps": 10,,\n  "x": 2\n}\n' >"$T/bad.json"
run badjson 2 "$T/bad.json" && has "invalid JSON: line and column" "$T/badjson.err" \
  "bad.json: line 3, column 21: expected valid JSON, found \",\""

# wrong types: all errors at once
cat >"$T/types.json" <<'JSON'
{"optimizer": {"params": {"lr": "abc"}}, "zero_optimization": {"stage": 5},
 "model": {"type": "transformer"}, "optimiser": {}}
JSON
run types 2 "$T/types.json" && {
  has "wrong type: lr" "$T/types.err" 'types.json: optimizer.params.lr: expected a number > 0, found "abc"'
  has "out of range: stage" "$T/types.err" "types.json: zero_optimization.stage: expected an integer in [0, 3], found 5"
  has "bad enum: model.type" "$T/types.err" 'types.json: model.type: expected one of "gpt", "llama", "mlp", found "transformer"'
  has "unknown key with suggestion" "$T/types.err" "types.json: optimiser: unknown key (did you mean optimizer?)"
  has "error count" "$T/types.err" "4 errors in"
}

# the batch identity at the given world size
echo '{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2}' >"$T/batch.json"
run batch_ok 0 "$T/batch.json" --world-size 2 &&
  eq "batch identity holds at world size 2" "$(json_get "$T/batch_ok.out" '["gradient_accumulation_steps"]')" 2
run batch_bad 2 "$T/batch.json" --world-size 3 && has "batch identity error names all three and the world size" \
  "$T/batch_bad.err" "train_batch_size 32, train_micro_batch_size_per_gpu 8, gradient_accumulation_steps 2, world size 3"

# strategy vs stage
echo '{"strategy": "ddp", "zero_optimization": {"stage": 2}}' >"$T/strat.json"
run strat 2 "$T/strat.json" && has "strategy and stage conflict" "$T/strat.err" \
  'strategy "ddp" and zero_optimization.stage 2: expected the same thing'
run strat_ov 0 "$T/strat.json" strategy=zero2 && pass "an override of strategy settles it"

# a DeepSpeed config as the HF Trainer writes it
cat >"$T/ds.json" <<'JSON'
{
  "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
  "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
    "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
    "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true},
  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false
}
JSON
run ds 0 "$T/ds.json" --world-size 2 && {
  has "DeepSpeed config: ignored keys listed" "$T/ds.err" "ignoring DeepSpeed keys that dtrun does not implement: fp16, zero_optimization.sub_group_size"
  eq "DeepSpeed config: stage 3 is fsdp" "$(json_get "$T/ds.out" '["strategy"]')" fsdp
  eq "DeepSpeed config: batch from world size" "$(json_get "$T/ds.out" '["train_batch_size"]')" 2
}

# tensor_parallel: keys, the batch over the data-parallel size, DeepSpeed's autotp_size
make_text "$T/a.txt" 1 400
cat >"$T/tp.json" <<JSON
{"model": {"type": "gpt", "n_layer": 1, "n_head": 4, "n_embd": 32, "seq_len": 16},
 "data": {"train": "$T/a.txt"}, "train_steps": 2, "train_micro_batch_size_per_gpu": 2,
 "gradient_accumulation_steps": 3, "tensor_parallel": {"size": 2, "sequence_parallel": true}}
JSON
run tp_ok 0 "$T/tp.json" --world-size 4 && {
  eq "tensor_parallel.size in the dump" "$(json_get "$T/tp_ok.out" '["tensor_parallel"]["size"]')" 2
  eq "tensor_parallel.sequence_parallel in the dump" "$(json_get "$T/tp_ok.out" '["tensor_parallel"]["sequence_parallel"]')" True
  eq "TP 2 at world 4: train_batch_size = 2 * 3 * 2 DP ranks" "$(json_get "$T/tp_ok.out" '["train_batch_size"]')" 12
}
run tp_alias 0 "$T/tp.json" --world-size 2 tensor_parallel.autotp_size=1 &&
  eq "tensor_parallel.autotp_size sets size" "$(json_get "$T/tp_alias.out" '["tensor_parallel"]["size"]')" 1
sed 's/"size": 2/"size": 2, "autotp_size": 4/' "$T/tp.json" >"$T/tp_both.json"
run tp_both 2 "$T/tp_both.json" --world-size 4 && has "size and autotp_size differ: both named" "$T/tp_both.err" \
  "tp_both.json: tensor_parallel.size 2 and tensor_parallel.autotp_size 4: expected the same value"
run tp_world 2 "$T/tp.json" --world-size 3 && has "TP size not dividing the world: names the key" "$T/tp_world.err" \
  "tensor_parallel.size 2: expected a divisor of the world size 3"
run tp_batch 2 "$T/tp.json" --world-size 4 train_batch_size=24 && has "batch error says the DP size and how it came" \
  "$T/tp_batch.err" "world size 4 / tensor_parallel.size 2 = 2 data-parallel ranks: expected train_batch_size"
run tp_keys 0 --keys && has "--keys lists tensor_parallel.size" "$T/tp_keys.out" "tensor_parallel.sequence_parallel"

# the launcher: bad TP configs exit 2 naming the key before any worker starts (no
# log folder made, "nothing was started"); a good one passes the checks
# launch NAME WANT_RC TEXT FLAGS... -- OVERRIDES...: dtrun FLAGS tp.json log.dir=... OVERRIDES
launch() {
  local name=$1 want=$2 text=$3; shift 3
  local flags=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do flags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  # a timeout: a check that let a 2-node launch through would wait for the other node
  timeout 60 "$DTRUN" "${flags[@]}" "$T/tp.json" log.dir="$T/log_$name" checkpoint.dir="$T/ck_$name" "$@" \
    >"$T/$name.out" 2>&1; local rc=$?
  if [ $rc -eq "$want" ] && grep -qF -- "$text" "$T/$name.out" &&
     { [ "$want" -eq 0 ] || { grep -qF "nothing was started" "$T/$name.out" && [ ! -e "$T/log_$name" ]; }; }; then
    pass "launch $name: exit $want, <$text>"
  else fail "launch $name" "exit $rc (expected $want): $(head -c 600 "$T/$name.out")"; fi
}
launch l_world 2 "tensor_parallel.size 3: expected a divisor of the world size 2" \
  --nproc_per_node 2 -- tensor_parallel.size=3 model.n_head=3 model.n_embd=48
launch l_nodes 2 "tensor_parallel.size 2 and nproc_per_node 1: expected nproc_per_node to be a multiple" \
  --nnodes 2 --nproc_per_node 1 --rdzv_endpoint 127.0.0.1:$(free_port) --
launch l_heads 2 "tensor_parallel.size: 4 does not divide model.n_head (2)" \
  --nproc_per_node 4 -- tensor_parallel.size=4 model.n_head=2
launch l_mlp 2 "tensor_parallel.size: model.type mlp has no tensor-parallel layers" \
  --nproc_per_node 2 -- model.type=mlp
launch l_hsdp 2 'tensor_parallel.size 2 with strategy "hsdp"' --nproc_per_node 2 -- strategy=hsdp
launch l_vocab 2 "model.vocab_pad_multiple: the padded vocabulary (256 rows, a multiple of 1) must divide among tensor_parallel.size 3" \
  --nproc_per_node 3 -- tensor_parallel.size=3 model.n_head=3 model.n_embd=48 model.vocab_pad_multiple=1 tensor_parallel.sequence_parallel=false
launch l_sprows 2 "tensor_parallel.sequence_parallel: the micro-batch's train_micro_batch_size_per_gpu x model.seq_len = 1 x 30 = 30 token rows must divide among tensor_parallel.size 4" \
  --nproc_per_node 4 -- tensor_parallel.size=4 model.seq_len=30 train_micro_batch_size_per_gpu=1 gradient_accumulation_steps=1 train_batch_size=1
launch l_good 0 '"size":	2' --nproc_per_node 2 --print-config --
has "launch of TP 2 on 2 ranks: train_batch_size = 2 * 3 * 1 DP rank" "$T/l_good.out" '"train_batch_size":	6,'
[ ! -e "$T/log_l_good" ] && pass "launch --print-config of a good TP config starts nothing" ||
  fail "launch --print-config of a good TP config starts nothing"

# usage errors
run noargs 2 && pass "no config: exit 2"
run badws 2 configs/demo.json --world-size zero && has "bad --world-size" "$T/badws.err" "--world-size: expected an integer >= 1, found zero"
run keys 0 --keys && has "--keys lists keys with defaults" "$T/keys.out" "optimizer.params.lr"
finish
