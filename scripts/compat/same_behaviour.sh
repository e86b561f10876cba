#!/usr/bin/env bash
# same_behaviour.sh OLD_DTRUN NEW_DTRUN [OUTDIR] - checks that a restructuring changed
# no behaviour (issue 30's "Done when"): runs one fixed set of commands with each binary
# and compares what they print and write, byte for byte after normalising only what
# varies from run to run. Prints one line per check, "same: NAME" or "DIFFERENT: NAME"
# with the first differing lines, and exits 1 if any check differs (2: bad usage).
#
# The set (every command's stdout, stderr and exit code unless said otherwise):
#   cli/      --version, --help, plan --help, config --help, config --keys
#   config/   `dtrun config` of every configs/*.json (also at --world-size 2 and with
#             --print-config), overrides (zero stages 1-3, fsdp, hsdp, TP, PP and its
#             schedules/partitions, 3D, recompute policies, LoRA, offload, bf16) and
#             invalid configs and overrides (exit 2 and their messages)
#   plan/     text and --json of every preset, of every `dtrun plan` line in README.md's
#             code blocks (extracted; `[--sp]` run without and with; --measure lines
#             skipped: they time a real run), TP/PP/LoRA variants, and bad plan flags
#   train/    short runs (3 steps, tiny models, the integration tests' configs) through
#             the launcher: gpt under ddp, zero1, zero2, fsdp, hsdp, TP 2 (+ sequence
#             parallel), PP 2 (1f1b, gpipe, interleaved), TP 2 x PP 2, PP 2 x DP 2,
#             recompute, offload, a resume at another world size; llama under ddp, fsdp
#             (tied), TP 2, PP 2; mlp; LoRA (1 rank, fsdp on 2, int8 base); layouts the
#             launcher refuses; the memory check's refusal. Each run is up to six
#             checks: its log (stdout/stderr/rc), losses (metrics.jsonl), summary.json,
#             the resolved config.json, the final parameters (DTRUN_DUMP_PARAMS: sha256)
#             and the checkpoint (latest, meta.json, every shard's sha256)
#   export/   safetensors, hf (fp32, bf16, sharded), TP x PP checkpoint, llama, LoRA
#             peft and merged: every written file (sha256 of binaries), bad flags
#   sample/   fixed-seed sampling from checkpoints and the HF fixtures (KV cache and
#             --no-cache, --ids, --logits), bad flags; bench comm / store bad flags
#
# Both sides run in the same directory, OUTDIR/work (the binary copied to
# OUTDIR/work/bin/dtrun with the libdtrun_cuda.so beside it, if any), which is then
# renamed OUTDIR/old or OUTDIR/new: paths printed or saved are the same on both sides
# and need no normalising. Normalised (nothing else):
#   - the git revision in `dtrun X (REV)` (--version);
#   - in training, export and sample logs: numbers with a time or rate unit (s, ms, µs,
#     GB/s, MB/s, tok/s, tokens/s), MFU, ETA and the per-step (compute, comm, data) ms,
#     pids, host:port, 16-hex-digit run ids, dates, host RSS, the agent's mktemp run
#     folder (/tmp/dtrun-run-XXXXXX); the timing-driven warnings
#     (straggler, waited for data) dropped; lines of ranks sorted stably by rank (the
#     agent interleaves its workers' lines as they come);
#   - metrics.jsonl and summary.json: the timing keys dropped (keys ending _ms or _s,
#     _ms_per_step, mfu, slowest_rank, times_slowest, stragglers, the measured
#     pp_bubble / bubble; the ideal bubble stays), the rest kept as printed;
#   - meta.json: run_id (random) and saved_at (a date) dropped;
#   - CPU plans get --gpu-mem 24 --gpu-tflops 0.5 (unless given): the host's free memory
#     and a measured sgemm peak otherwise go into them; DTRUN_TEST_MEM_AVAILABLE is set
#     for the whole run (16e9; the memory check's refusal case sets its own).
# Needs python3 with numpy (LoRA fixtures' token shard). About 25 s a side on 2 cores.
# Not part of `make test`. Example: make && scripts/compat/same_behaviour.sh /tmp/base/dtrun ./dtrun
set -u
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: $0 OLD_DTRUN NEW_DTRUN [OUTDIR]" >&2
  exit 2
fi
REPO=$(cd "$(dirname "$0")/../.." && pwd)
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
OLD=$(abs "$1") NEW=$(abs "$2")
for b in "$OLD" "$NEW"; do [ -x "$b" ] || { echo "$b: not an executable" >&2; exit 2; }; done
OUT=${3:-$(mktemp -d /tmp/dtrun-same.XXXXXX)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
rm -rf "$OUT/old" "$OUT/new" "$OUT/work"
T="timeout -k 2 120"
export DTRUN_TEST_MEM_AVAILABLE=16e9
unset DTRUN_CUDA_ATTENTION DTRUN_COMM DTRUN_LOG_LEVEL DTRUN_SKIP_MEMORY_CHECK

# ---- recording (cwd: OUTDIR/work; results under res/CHECK/, their order in checks.list)
# rec NAME CMD...: stdout, stderr and exit code of CMD into res/NAME/
rec() {
  local d=res/$1; shift
  mkdir -p "$d" && echo "${d#res/}" >>checks.list
  $T "$@" >"$d/stdout" 2>"$d/stderr"
  echo $? >"$d/rc"
}
# keep NAME FILE...: copies files (or folders) into res/NAME/, "absent" listing the missing
keep() {
  local d=res/$1 f; shift
  mkdir -p "$d" && echo "${d#res/}" >>checks.list
  for f in "$@"; do
    if [ -e "$f" ]; then cp -r "$f" "$d/"; else echo "$(basename "$f")" >>"$d/absent"; fi
  done
}
# train NAME NPROC CONFIG ARGS...: a run through the launcher, log in runs/NAME, its
# checkpoint in runs/NAME/ck (a copy of $FROM_CKPT first, when set: a resume), final
# parameters in runs/NAME/params.bin
train() {
  local n=$1 np=$2 cfg=$3; shift 3
  rm -rf "runs/$n" && mkdir -p "runs/$n"
  [ -n "${FROM_CKPT:-}" ] && cp -r "$FROM_CKPT" "runs/$n/ck"
  rec "train/$n/log" env DTRUN_DUMP_PARAMS="runs/$n/params.bin" dtrun --standalone --nproc_per_node "$np" \
    "$cfg" log.dir="runs/$n/log" checkpoint.dir="runs/$n/ck" "$@"
  keep "train/$n/losses" "runs/$n/log/metrics.jsonl"
  keep "train/$n/summary" "runs/$n/log/summary.json"
  keep "train/$n/config" "runs/$n/log/config.json"
  keep "train/$n/params" "runs/$n/params.bin"
  keep "train/$n/ckpt" "runs/$n/ck"
}
# refuse NAME NPROC CONFIG ARGS...: a launch expected to stop before training (log only)
refuse() {
  local n=$1 np=$2 cfg=$3; shift 3
  rec "train/$n" dtrun --standalone --nproc_per_node "$np" "$cfg" log.dir="runs/$n/log" \
    checkpoint.dir="runs/$n/ck" "$@"
}
# plan_pins ARGS...: --gpu-mem / --gpu-tflops for a CPU plan (see the top)
plan_pins() {
  local a cpu=0 mem=0 fl=0 prev=
  for a in "$@"; do
    case $a in
      *.json) [ -f "$a" ] && grep -Eq '"device": *"cpu"' "$a" && cpu=1 ;;
      device=cpu) cpu=1 ;;
      cpu) [ "$prev" = --gpu ] && cpu=1 ;;
      --gpu-mem) mem=1 ;;
      --gpu-tflops) fl=1 ;;
    esac
    prev=$a
  done
  [ $cpu = 1 ] || return 0
  [ $mem = 1 ] || printf '%s\n' --gpu-mem 24
  [ $fl = 1 ] || printf '%s\n' --gpu-tflops 0.5
}
# plan NAME ARGS...: `dtrun plan ARGS` as text (NAME_text) and --json (NAME_json)
plan() {
  local n=$1; shift
  local -a pins
  mapfile -t pins < <(plan_pins "$@")
  rec "plan/${n}_text" dtrun plan "$@" "${pins[@]}"
  rec "plan/${n}_json" dtrun plan "$@" "${pins[@]}" --json
}

# ---- fixtures (the same bytes on both sides)
fixtures() {
  ln -s "$REPO/configs" configs
  python3 - <<'PY'
import random
random.seed(1)  # tests/integration/lib.sh's make_text, seed 1, 3000 lines
words = "the quick brown fox jumps over a lazy dog while seven tired cats sleep".split()
open("text.txt", "w").write("".join(" ".join(random.choice(words) for _ in range(random.randint(3, 9))) + ".\n"
                                    for _ in range(3000)))
PY
  # gpt: test_tp.sh's model (4 heads of 8, 2 layers); 3 steps of 2 micro-batches of 2,
  # evaluation at step 2, a checkpoint at the end
  cat >gpt.json <<JSON
{"model": {"type": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 32, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "train_steps": 3, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2}},
 "gradient_clipping": 1.0, "zero_optimization": {"reduce_bucket_size": 6000},
 "eval": {"every_steps": 2, "batches": 2}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 3, "resume": "never", "overwrite": true}}
JSON
  # llama: test_llama.sh's model (GQA 4/2 heads, 2 layers, hidden 32)
  cat >llama.json <<JSON
{"model": {"type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 48, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 64, "seq_len": 32, "vocab_size": 256},
 "data": {"train": "text.txt", "val_fraction": 0.05},
 "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "train_steps": 3, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "gradient_clipping": 1.0, "zero_optimization": {"reduce_bucket_size": 6000},
 "eval": {"every_steps": 2, "batches": 2}, "threads": 1, "seed": 5,
 "checkpoint": {"every_steps": 3, "resume": "never", "overwrite": true}}
JSON
  # LoRA: lora_compare.py's config on tests/fixtures/lora (r 4, every linear module, fp32
  # base, adapters from adapter_init), and test_lora.sh's 257-token shard for 2 ranks
  python3 - "$REPO" <<'PY' || echo "lora fixtures: python3 with numpy needed" >&2
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "scripts/compat"))
import numpy as np, hf_compare, lora_compare
fix = os.path.join(sys.argv[1], "tests/fixtures/lora")
os.makedirs("lora", exist_ok=True)
json.dump(lora_compare.config(fix, "lora", 3), open("lora.json", "w"), indent=1)
hf_compare.write_shard("lora/big.bin", np.random.default_rng(5).integers(0, 97, 257).tolist())
big = lora_compare.config(fix, "lora", 3, gradient_accumulation_steps=1, data={"train": "lora/big.bin", "val": "lora/big.bin"})
json.dump(big, open("lora_big.json", "w"), indent=1)
PY
  # stand-ins for the files README.md's plan lines name: test_plan_cli.sh's llama3-8b.json,
  # and cfg.json a LoRA config on the tiny HF llama
  cat >llama3-8b.json <<'JSON'
{"model": {"type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "rope_theta": 500000.0,
           "max_position_embeddings": 8192, "seq_len": 8192, "vocab_size": 128256,
           "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}},
 "data": {"train": "shards/*.bin"}, "bf16": {"enabled": true}, "train_batch_size": 512,
 "train_micro_batch_size_per_gpu": 1, "strategy": "fsdp"}
JSON
  cat >cfg.json <<JSON
{"model": {"pretrained": "$REPO/tests/fixtures/hf/llama"}, "data": {"train": "shards/*.bin"},
 "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "base_dtype": "int8",
          "target_modules": ["q_proj","k_proj","v_proj","o_proj","gate_proj","up_proj","down_proj"]}}
JSON
  # invalid configs (test_config_cli.sh's)
  printf '{\n  "seed": 1,\n  "train_steps": 10,,\n  "x": 2\n}\n' >bad.json
  cat >types.json <<'JSON'
{"optimizer": {"params": {"lr": "abc"}}, "zero_optimization": {"stage": 5},
 "model": {"type": "transformer"}, "optimiser": {}}
JSON
  echo '{"strategy": "ddp", "zero_optimization": {"stage": 2}}' >strat.json
  echo '{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2}' >batch.json
  mkdir -p exists_dir
}

# ---- the checks
cli_checks() {
  rec cli/version dtrun --version
  rec cli/help dtrun --help
  rec cli/plan_help dtrun plan --help
  rec cli/config_help dtrun config --help
  rec cli/config_keys dtrun config --keys
  rec cli/no_args dtrun
  rec cli/unknown_flag dtrun --frobnicate gpt.json
}

config_checks() {
  local f n
  for f in configs/*.json; do
    n=$(basename "$f" .json)
    rec "config/preset_$n" dtrun config "$f"
    rec "config/preset_${n}_ws2" dtrun config "$f" --world-size 2
    rec "config/preset_${n}_print" dtrun config "$f" --world-size 4 --print-config
  done
  local D=configs/demo.json L=configs/llama-tiny.json
  rec config/zero1 dtrun config $D zero_optimization.stage=1 --world-size 2
  rec config/zero2 dtrun config $D zero_optimization.stage=2 --world-size 2
  rec config/zero3 dtrun config $D zero_optimization.stage=3 --world-size 2
  rec config/strategy_zero2 dtrun config $D strategy=zero2 --world-size 2
  rec config/fsdp dtrun config $D strategy=fsdp --world-size 4
  rec config/hsdp dtrun config $D strategy=hsdp --world-size 4
  rec config/tp2 dtrun config $D tensor_parallel.size=2 --world-size 4
  rec config/tp2_sp dtrun config $D tensor_parallel.size=2 tensor_parallel.sequence_parallel=true strategy=zero1 --world-size 4
  rec config/autotp dtrun config $L tensor_parallel.autotp_size=2 --world-size 2
  rec config/pp2 dtrun config $D pipeline.stages=2 gradient_accumulation_steps=4 --world-size 2
  rec config/pp4_gpipe_flops dtrun config $D pipeline.stages=4 pipeline.schedule=gpipe pipeline.partition=flops --world-size 4
  rec config/pp2_interleaved dtrun config $D pipeline.stages=2 pipeline.schedule=interleaved pipeline.virtual_stages=2 gradient_accumulation_steps=4 --world-size 2
  rec config/pp2_parameters dtrun config $L pipeline.stages=2 pipeline.partition=parameters gradient_accumulation_steps=2 --world-size 2
  rec config/3d dtrun config $D tensor_parallel.size=2 pipeline.stages=2 strategy=zero1 gradient_accumulation_steps=4 --world-size 8
  rec config/recompute_selective dtrun config $D activation_checkpointing.policy=selective
  rec config/recompute_full_every dtrun config $D activation_checkpointing.policy=full activation_checkpointing.every=2
  rec config/recompute_deepspeed dtrun config $D activation_checkpointing.number_checkpoints=2 activation_checkpointing.partition_activations=true
  rec config/bad_lora_on_demo dtrun config $D model.pretrained=$REPO/tests/fixtures/lora/base lora.r=4 lora.alpha=8 model.type=llama
  rec config/lora_r8 dtrun config lora.json lora.r=8 lora.alpha=16 lora.target_modules=q_proj,v_proj
  rec config/lora_file dtrun config lora.json
  rec config/lora_int8_fsdp dtrun config lora.json lora.base_dtype=int8 strategy=fsdp --world-size 2
  rec config/offload dtrun config $D strategy=zero1 zero_optimization.offload_optimizer.device=cpu zero_optimization.offload_optimizer.pin_memory=true --world-size 2
  rec config/bf16 dtrun config $D bf16.enabled=true communication_data_type=bf16
  rec config/llama_tied dtrun config $L model.tie_word_embeddings=true model.attention_bias=true
  rec config/batch_ok dtrun config batch.json --world-size 2
  rec config/strat_override dtrun config strat.json strategy=zero2
  # invalid
  rec config/bad_unknown_override dtrun config $D model.n_layr=2
  rec config/bad_missing_file dtrun config nope.json
  rec config/bad_json dtrun config bad.json
  rec config/bad_types dtrun config types.json
  rec config/bad_batch dtrun config batch.json --world-size 3
  rec config/bad_strategy_stage dtrun config strat.json
  rec config/bad_stage dtrun config $D zero_optimization.stage=4
  rec config/bad_strategy dtrun config $D strategy=zero4
  rec config/bad_tp_world dtrun config $D tensor_parallel.size=3 --world-size 4
  rec config/bad_tp_heads dtrun config $D tensor_parallel.size=8 --world-size 8
  rec config/bad_tp_hsdp dtrun config $D tensor_parallel.size=2 strategy=hsdp --world-size 4
  rec config/bad_tp_mlp dtrun config configs/mlp-tiny.json tensor_parallel.size=2 --world-size 2
  rec config/bad_pp_1f1b_m dtrun config $D pipeline.stages=2 --world-size 2
  rec config/bad_pp_interleaved_m dtrun config $D pipeline.stages=2 pipeline.schedule=interleaved pipeline.virtual_stages=2 gradient_accumulation_steps=3 --world-size 2
  rec config/pp_chunks_over_layers dtrun config $D pipeline.stages=4 pipeline.schedule=interleaved pipeline.virtual_stages=2 gradient_accumulation_steps=8 --world-size 4
  rec config/bad_pp_schedule dtrun config $D pipeline.stages=2 pipeline.schedule=zigzag gradient_accumulation_steps=4 --world-size 2
  rec config/bad_pp_partition dtrun config $D pipeline.stages=2 pipeline.partition=random gradient_accumulation_steps=4 --world-size 2
  rec config/bad_pp_world dtrun config $D pipeline.stages=3 gradient_accumulation_steps=4 --world-size 4
  rec config/bad_recompute dtrun config $D activation_checkpointing.policy=some
  rec config/lora_tp dtrun config lora.json tensor_parallel.size=2 --world-size 2
  rec config/lora_dropout dtrun config lora.json lora.dropout=0.1
  rec config/bad_lora_base_dtype dtrun config lora.json lora.base_dtype=int4
  rec config/bad_offload_ddp dtrun config $D zero_optimization.offload_optimizer.device=cpu
  rec config/bad_lr dtrun config $D optimizer.params.lr=abc
  rec config/bad_lr_nan dtrun config $D optimizer.params.lr=nan
  rec config/bad_world dtrun config $D --world-size 0
  rec config/bad_accum dtrun config $D gradient_accumulation_steps=70000
  rec config/bad_no_eq dtrun config $D strategy
}

plan_checks() {
  local f n i=0 line
  for f in configs/*.json; do
    n=$(basename "$f" .json)
    plan "preset_$n" "$f"
  done
  plan fsdp_example_gpus124 configs/fsdp-example.json --gpus 1,2,4
  plan gpt2_tp_pp_auto configs/gpt2-124m.json --gpus 8 --tp auto --pp auto --sp
  plan gpt2_pp_gpipe_flops configs/gpt2-124m.json --gpus 4,8 --pp 2,4 --schedule gpipe --partition flops
  plan gpt2_interleaved configs/gpt2-124m.json --gpus 8 --pp 2 --schedule interleaved --virtual-stages 3
  plan gpt2_bad_accum configs/gpt2-124m.json --gpus 8 --pp 2 --accum 4
  plan llama_tiny_pp configs/llama-tiny.json gradient_accumulation_steps=4 --pp 2 --gpus 2,4 --gpu h100
  plan demo_overrides configs/demo.json strategy=fsdp activation_checkpointing.policy=selective --gpus 1,2
  plan demo_strategies configs/demo.json --gpus 2 --strategy ddp,zero2
  plan seven_b --params 7e9 --layers 32 --hidden 4096 --seq 2048 --tokens 2e10 --price 2
  plan seven_b_gqa --params 7e9 --layers 32 --hidden 4096 --seq 2048 --kv-heads 8 --ffn 11008 --nodes 2x8 --link ib200
  plan params_cpu --params 1e6 --layers 2 --hidden 64 --heads 2 --seq 64 --gpu cpu
  plan lora_fixture lora.json --lora-r 4 --base-dtype int8
  plan lora_cfg_fp32 cfg.json --lora-r 8 --base-dtype fp32 --gpus 1,2
  # every `dtrun plan` line of README.md's code blocks
  while IFS= read -r line; do
    i=$((i + 1))
    case $line in
      *--measure*) echo "readme_$i: $line" >>skipped; continue ;;
    esac
    rec_plan_line "plan/readme_$i" "$line"
  done < <(python3 - "$REPO/README.md" <<'PY'
import re, sys
lines, block, cur = [], False, ""
for raw in open(sys.argv[1], encoding="utf-8"):
    if raw.startswith("```"):
        block = not block
        continue
    if not block:
        continue
    s = raw.rstrip("\n")
    if cur:
        s = cur + " " + s.strip()
        cur = ""
    if s.rstrip().endswith("\\"):
        cur = s.rstrip()[:-1].rstrip()
        continue
    s = re.sub(r"\s+#.*$", "", s).strip()
    if re.match(r"^([A-Z_]+=\S+\s+)*dtrun plan(\s|$)", s):  # commands, not output
        if "[--sp]" in s:  # an optional flag: without and with it
            lines += [s.replace(" [--sp]", ""), s.replace("[--sp]", "--sp")]
        else:
            lines.append(s)
for s in lines:
    print(s)
PY
  )
  # bad flags (test_plan_cli.sh's and more)
  local S="--params 7e9 --layers 32 --hidden 4096 --seq 2048"
  rec plan/bad_no_model dtrun plan --gpus 1,2
  rec plan/bad_gpus_0 dtrun plan $S --gpus 0
  rec plan/bad_gpus_x dtrun plan $S --gpus 1,x
  rec plan/bad_gpus_missing dtrun plan $S --gpus
  rec plan/bad_gpus_node_multiple dtrun plan $S --gpus 12
  rec plan/bad_mfu_1.5 dtrun plan $S --mfu 1.5
  rec plan/bad_mfu_0 dtrun plan $S --mfu 0
  rec plan/bad_mfu_nan dtrun plan $S --mfu nan
  rec plan/bad_reserve dtrun plan $S --reserve 1.5
  rec plan/bad_gpu dtrun plan $S --gpu tpu-v9
  rec plan/bad_gpu_mem dtrun plan $S --gpu-mem -4
  rec plan/bad_gpu_tflops_inf dtrun plan $S --gpu-tflops inf
  rec plan/bad_link dtrun plan $S --link smoke-signals
  rec plan/bad_link_gbps dtrun plan $S --link-gbps abc
  rec plan/bad_config_and_params dtrun plan x.json --params 7e9
  rec plan/bad_params_x dtrun plan --params 7x --layers 32 --hidden 4096 --seq 2048
  rec plan/bad_params_no_layers dtrun plan --params 7e9 --hidden 4096 --seq 2048
  rec plan/bad_heads dtrun plan $S --heads 33
  rec plan/bad_kv_heads dtrun plan $S --kv-heads 5 --ffn 11008
  rec plan/bad_vocab dtrun plan $S --vocab 0
  rec plan/bad_micro_batch dtrun plan $S --micro-batch -1
  rec plan/bad_accum dtrun plan $S --accum 0
  rec plan/bad_seq dtrun plan --params 7e9 --layers 32 --hidden 4096 --seq 1e99
  rec plan/bad_precision dtrun plan $S --precision fp16
  rec plan/bad_comm_dtype dtrun plan $S --comm-dtype int8
  rec plan/bad_tokens_hours dtrun plan $S --tokens 1e9 --hours-1gpu 5
  rec plan/bad_tokens_neg dtrun plan $S --tokens -1e9
  rec plan/bad_price dtrun plan $S --price -1
  rec plan/bad_nodes dtrun plan $S --nodes 2by8
  rec plan/bad_nodes_gpn dtrun plan $S --nodes 2x8 --gpus-per-node 4
  rec plan/bad_strategy dtrun plan $S --strategy ddp,zero9
  rec plan/bad_tp_3 dtrun plan $S --gpus 8 --tp 3
  rec plan/bad_tp_x dtrun plan $S --tp x
  rec plan/bad_pp_0 dtrun plan $S --pp 0
  rec plan/bad_pp_virtual dtrun plan $S --pp 4 --virtual-stages 16 --accum 8
  rec plan/bad_pp_1f1b_accum dtrun plan $S --pp 4 --accum 2
  rec plan/bad_pp_interleaved_accum dtrun plan $S --pp 4 --accum 6 --schedule interleaved
  rec plan/bad_schedule dtrun plan $S --pp 2 --schedule zigzag
  rec plan/bad_partition dtrun plan $S --pp 2 --partition random
  rec plan/bad_pp_mlp dtrun plan configs/mlp-tiny.json --pp 2 --gpu h100
  rec plan/bad_measure_params dtrun plan $S --measure
  rec plan/bad_lora_r dtrun plan lora.json --lora-r -4
  rec plan/bad_base_dtype dtrun plan lora.json --lora-r 4 --base-dtype int4
  rec plan/bad_unknown_flag dtrun plan $S --frobnicate
  rec plan/bad_config_override dtrun plan configs/demo.json model.n_layr=2
  rec plan/bad_fused_env env DTRUN_CUDA_ATTENTION=flash dtrun plan $S
}
# rec_plan_line NAME LINE: a README plan line as text and --json (pins as plan())
rec_plan_line() {
  local n=$1 line=$2 text json
  local -a words pins
  read -r -a words <<<"$line"
  mapfile -t pins < <(plan_pins "${words[@]}")
  text=$(printf '%s ' "${words[@]}" | sed 's/ --json / /')
  json="${text}--json"
  text="$text${pins[*]:+${pins[*]}}"
  json="$json${pins[*]:+ ${pins[*]}}"
  mkdir -p "res/${n}_text" "res/${n}_json"
  echo "$text" >"res/${n}_text/cmd"
  echo "$json" >"res/${n}_json/cmd"
  rec "${n}_text" bash -c "$text"
  rec "${n}_json" bash -c "$json"
}

train_checks() {
  local s
  train gpt_1rank 1 gpt.json
  for s in ddp zero1 zero2 fsdp hsdp; do train "gpt_$s" 2 gpt.json strategy=$s; done
  train gpt_stage2 2 gpt.json zero_optimization.stage=2
  train gpt_overlap_off 2 gpt.json strategy=zero2 zero_optimization.overlap_comm=false
  train gpt_tp2 2 gpt.json tensor_parallel.size=2
  train gpt_tp2_sp 2 gpt.json tensor_parallel.size=2 tensor_parallel.sequence_parallel=true
  train gpt_pp2_1f1b 2 gpt.json pipeline.stages=2
  train gpt_pp2_gpipe 2 gpt.json pipeline.stages=2 pipeline.schedule=gpipe
  train gpt_pp2_interleaved 2 gpt.json model.n_layer=4 pipeline.stages=2 pipeline.schedule=interleaved \
    pipeline.virtual_stages=2
  train gpt_tp2_pp2 4 gpt.json tensor_parallel.size=2 pipeline.stages=2 strategy=zero1
  train gpt_pp2_dp2_fsdp 4 gpt.json pipeline.stages=2 strategy=fsdp eval.every_steps=0
  train gpt_recompute_selective 2 gpt.json strategy=fsdp activation_checkpointing.policy=selective
  train gpt_recompute_full 1 gpt.json activation_checkpointing.policy=full activation_checkpointing.every=2
  train gpt_offload_cpu 2 gpt.json strategy=zero1 zero_optimization.offload_optimizer.device=cpu
  # resume: the 2-rank fsdp run's step-3 checkpoint at 1 rank under zero2, on to step 5
  FROM_CKPT=runs/gpt_fsdp/ck train gpt_resume_1rank 1 gpt.json strategy=zero2 train_steps=5 \
    checkpoint.resume=auto checkpoint.overwrite=false checkpoint.every_steps=5
  train llama_ddp 2 llama.json
  train llama_fsdp_tied 2 llama.json strategy=fsdp model.tie_word_embeddings=true model.attention_bias=true
  train llama_tp2 2 llama.json tensor_parallel.size=2
  train llama_pp2 2 llama.json pipeline.stages=2 pipeline.partition=flops
  train mlp_zero2 2 configs/mlp-tiny.json strategy=zero2 train_steps=4 steps_per_print=1
  train lora_1rank 1 lora.json
  train lora_fsdp 2 lora_big.json strategy=fsdp
  train lora_int8 1 lora.json lora.base_dtype=int8
  refuse refuse_tp3 2 gpt.json tensor_parallel.size=3
  refuse refuse_pp_m 2 gpt.json pipeline.stages=2 gradient_accumulation_steps=1
  refuse refuse_hsdp_tp 2 gpt.json strategy=hsdp tensor_parallel.size=2
  refuse refuse_lora_pp 2 lora.json pipeline.stages=2
  # the memory check's refusal and its cheapest change (test_mem_check.sh's case; 1 rank:
  # with 2 the agent names whichever rank failed first)
  rec train/refuse_memory env DTRUN_TEST_MEM_AVAILABLE=1500000 dtrun --standalone --nproc_per_node 1 gpt.json \
    train_micro_batch_size_per_gpu=8 log.dir=runs/refuse_memory/log checkpoint.dir=runs/refuse_memory/ck
}
export_checks() {
  local G=runs/gpt_ddp/ck
  mkdir -p ex
  rec export/gpt_safetensors/log dtrun export $G -o ex/gpt.safetensors
  keep export/gpt_safetensors/files ex/gpt.safetensors
  rec export/gpt_hf/log dtrun export $G -o ex/gpt_hf --format hf
  keep export/gpt_hf/files ex/gpt_hf
  rec export/gpt_hf_bf16/log dtrun export $G/step_00000003 -o ex/gpt_hf_bf16 --format hf --dtype bf16
  keep export/gpt_hf_bf16/files ex/gpt_hf_bf16
  rec export/gpt_hf_shards/log dtrun export $G -o ex/gpt_hf_shards --format hf --max-shard-size 40KB
  keep export/gpt_hf_shards/files ex/gpt_hf_shards
  rec export/gpt_tp2_pp2/log dtrun export runs/gpt_tp2_pp2/ck -o ex/tp2pp2.safetensors
  keep export/gpt_tp2_pp2/files ex/tp2pp2.safetensors
  rec export/llama_hf/log dtrun export runs/llama_fsdp_tied/ck -o ex/llama_hf --format hf
  keep export/llama_hf/files ex/llama_hf
  rec export/llama_pp2_safetensors/log dtrun export runs/llama_pp2/ck -o ex/llama_pp2.safetensors --dtype bf16
  keep export/llama_pp2_safetensors/files ex/llama_pp2.safetensors
  rec export/lora_peft/log dtrun export runs/lora_1rank/ck -o ex/lora_peft --format peft
  keep export/lora_peft/files ex/lora_peft
  rec export/lora_merge/log dtrun export runs/lora_int8/ck -o ex/lora_merge --format hf --merge
  keep export/lora_merge/files ex/lora_merge
  rec export/lora_safetensors/log dtrun export runs/lora_fsdp/ck -o ex/lora_adapters.safetensors
  keep export/lora_safetensors/files ex/lora_adapters.safetensors
  rec export/bad_no_out dtrun export $G
  rec export/bad_empty_out dtrun export $G -o ''
  rec export/bad_dir_out dtrun export $G -o exists_dir
  rec export/bad_format dtrun export $G -o ex/x --format onnx
  rec export/bad_dtype dtrun export $G -o ex/x.safetensors --dtype fp16
  rec export/bad_shard_size dtrun export $G -o ex/x_hf --format hf --max-shard-size 12XB
  rec export/bad_merge_no_lora dtrun export $G -o ex/x_hf2 --format hf --merge
  rec export/bad_missing_ckpt dtrun export runs/nope -o ex/y.safetensors
}

sample_checks() {
  local G=runs/gpt_ddp/ck
  rec sample/gpt_seed1 dtrun sample $G --prompt "the " --tokens 40 --temperature 0.8 --top_k 40 --seed 1 --threads 1
  rec sample/gpt_seed2_nocache dtrun sample $G --prompt "a lazy " --tokens 20 --seed 2 --no-cache --threads 1
  rec sample/gpt_greedy_ids dtrun sample $G --prompt-ids 116,104,101 --temperature 0 --tokens 24 --ids --threads 1
  rec sample/gpt_tp2_pp2 dtrun sample runs/gpt_tp2_pp2/ck --prompt "the " --tokens 20 --seed 3 --threads 1
  rec sample/llama_tied dtrun sample runs/llama_fsdp_tied/ck --prompt "the " --tokens 20 --seed 1 --threads 1
  rec sample/llama_greedy_logits dtrun sample runs/llama_ddp/ck --prompt-ids 116,104 --temperature 0 --tokens 8 --ids --logits --threads 1
  rec sample/hf_llama dtrun sample tests/fixtures/hf/llama --prompt-ids 3,17,42 --temperature 0 --tokens 24 --ids --threads 1
  rec sample/hf_llama3_logits dtrun sample tests/fixtures/hf/llama3 --prompt-ids 3,17,42 --tokens 6 --ids --logits --threads 1
  rec sample/hf_qwen2 dtrun sample tests/fixtures/hf/qwen2 --prompt-ids 5,6,7 --tokens 16 --seed 4 --top_k 10 --ids --threads 1
  rec sample/hf_gpt2_nocache dtrun sample tests/fixtures/hf/gpt2 --prompt-ids 1,2,3 --tokens 16 --temperature 0 --ids --no-cache --threads 1
  rec sample/bad_tokens dtrun sample $G --tokens -1
  rec sample/bad_temperature dtrun sample $G --temperature nan
  rec sample/bad_top_k dtrun sample $G --top_k x
  rec sample/bad_seed dtrun sample $G --seed 1.5
  rec sample/bad_prompt_ids dtrun sample $G --prompt-ids 3,,4 --tokens 4 --threads 1
  rec sample/bad_seq_len_ckpt dtrun sample $G --prompt "the " --seq-len 16
  rec sample/bad_prompt_id_range dtrun sample $G --prompt-ids 300
  rec sample/bad_device dtrun sample $G --device tpu
  rec sample/bad_missing dtrun sample runs/nope
  rec sample/bad_flag dtrun sample $G --frobnicate
  rec sample/bench_comm_bad_op dtrun --standalone --nproc_per_node 1 bench comm --op all_to_some
  rec sample/bench_comm_bad_min dtrun --standalone --nproc_per_node 1 bench comm --min abc
  rec sample/bench_comm_bad_range dtrun --standalone --nproc_per_node 1 bench comm --min 64M --max 8
  rec sample/bench_store_bad_conns dtrun bench store --conns 0
}

# collect SIDE BINARY: runs every check with BINARY in OUTDIR/work, then renames it OUTDIR/SIDE
collect() {
  local side=$1 bin=$2 t0=$SECONDS
  mkdir -p "$OUT/work/bin" || return 1
  cp "$bin" "$OUT/work/bin/dtrun"
  [ -f "$(dirname "$bin")/libdtrun_cuda.so" ] && cp "$(dirname "$bin")/libdtrun_cuda.so" "$OUT/work/bin/"
  (
    cd "$OUT/work" || exit 1
    export PATH="$OUT/work/bin:$PATH"
    ln -s "$REPO/tests" tests
    : >checks.list
    fixtures
    cli_checks
    config_checks
    plan_checks
    train_checks
    export_checks
    sample_checks
  )
  mv "$OUT/work" "$OUT/$side"
  echo "collected $side ($bin) in $((SECONDS - t0)) s" >&2
}

t0=$SECONDS
collect old "$OLD" || exit 2
collect new "$NEW" || exit 2

# ---- comparing: one line per check
python3 - "$OUT" <<'PY'
import difflib, hashlib, json, os, re, sys

out = sys.argv[1]
LOG_CATS = ("train/", "export/", "sample/")
TIMING_KEYS = {"mfu", "slowest_rank", "times_slowest", "stragglers", "bubble", "pp_bubble"}


def timing_key(k):
    return k in TIMING_KEYS or k.endswith("_ms") or k.endswith("_s") or "_ms_" in k


def drop_keys(text, drop):
    """Removes `"key": value` (and a comma after it) for keys drop(key) says, keeping
    every other byte as printed."""
    dec = json.JSONDecoder()
    res, i = [], 0
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"\s*:\s*', text):
        if m.start() < i or not drop(m.group(1)):
            continue
        try:
            _, end = dec.raw_decode(text, m.end())
        except ValueError:
            continue
        e = re.match(r"\s*,", text[end:])
        res.append(text[i:m.start()])
        i = end + (e.end() if e else 0)
    res.append(text[i:])
    return "\n".join(l for l in "".join(res).split("\n") if l.strip())


REV = re.compile(r"^(dtrun \S+ )\([0-9a-f]{7,40}(-dirty)?\)", re.M)
UNIT = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(\s?)(s|ms|µs|us|GB/s|MB/s|tok/s|tokens/s)(?![\w/])")
LOG_RULES = [
    (re.compile(r"MFU (?:>100% \(the peak is an estimate\)|\d+(?:\.\d+)?%)"), "MFU #"),
    (re.compile(r"ETA \S+"), "ETA #"),
    (re.compile(r"\(compute [\d.]+, comm [\d.]+, data [\d.]+\)"), "(compute #, comm #, data #)"),
    (re.compile(r"\b(pid:? ?)\d+"), r"\1#"),
    (re.compile(r"\b((?:\d{1,3}\.){3}\d{1,3}|localhost|\[[0-9a-f:]+\]):\d+"), r"\1:#"),
    (re.compile(r"\b[0-9a-f]{16}\b"), "<run-id>"),
    (re.compile(r"\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d(\.\d+)?"), "<date>"),
    (re.compile(r"host RSS [\d.]+ \w?B before, peak [\d.]+ \w?B after"), "host RSS # before, peak # after"),
    (re.compile(r"/dtrun-run-[A-Za-z0-9]{6}\b"), "/dtrun-run-<tmp>"),
]
DROP_LINE = re.compile(r"straggler: rank|waited [\d.]+ ms of [\d.]+ ms .* for data")
RANK = re.compile(r"^\[rank(\d+)\]:")


def norm_log(text):
    lines = []
    for l in text.split("\n"):
        if DROP_LINE.search(l):
            continue
        l = UNIT.sub(lambda m: "#" + m.group(1) + m.group(2), l)
        for rx, rep in LOG_RULES:
            l = rx.sub(rep, l)
        lines.append(l)
    key = lambda l: int(RANK.match(l).group(1)) if RANK.match(l) else -1
    return "\n".join(sorted(lines, key=key))


def norm_file(check, rel, path):
    data = open(path, "rb").read()
    name = os.path.basename(rel)
    try:
        text = data.decode("utf-8")
        binary = "\0" in text
    except UnicodeDecodeError:
        binary = True
    if binary or name.endswith((".bin", ".safetensors")):
        return [f"{rel}: sha256 {hashlib.sha256(data).hexdigest()} {len(data)} bytes"]
    text = REV.sub(r"\1(REV)", text)
    if name == "meta.json":
        text = drop_keys(text, lambda k: k in ("run_id", "saved_at"))
    elif name in ("metrics.jsonl", "summary.json"):
        text = drop_keys(text, timing_key)
    elif name in ("stdout", "stderr") and check.startswith(LOG_CATS):
        if not (check.startswith("sample/") and name == "stdout"):
            text = norm_log(text)
    return [f"== {rel}"] + text.split("\n")


def view(side, check):
    d = os.path.join(out, side, "res", check)
    if not os.path.isdir(d):
        return [f"(no result: {side} did not record this check)"]
    lines = []
    for root, dirs, files in os.walk(d):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(root, f)
            lines += norm_file(check, os.path.relpath(p, d), p)
    return lines


def checks(side):
    p = os.path.join(out, side, "checks.list")
    return [l.strip() for l in open(p)] if os.path.exists(p) else []


names = list(dict.fromkeys(checks("old") + checks("new")))
ndiff = 0
for c in names:
    a, b = view("old", c), view("new", c)
    if a == b:
        print(f"same: {c}")
        continue
    ndiff += 1
    print(f"DIFFERENT: {c}")
    shown = 0
    for l in difflib.unified_diff(a, b, "old", "new", n=0, lineterm=""):
        if l.startswith(("---", "+++")):
            continue
        print("    " + l[:300])
        shown += 1
        if shown >= 12:
            print("    ...")
            break
for side in ("old", "new"):
    p = os.path.join(out, side, "skipped")
    if os.path.exists(p):
        for l in open(p):
            print(f"skipped ({side}): plan/{l.strip()}  (--measure times a real run)")
        break
print(f"{len(names) - ndiff} same, {ndiff} different of {len(names)} checks; results in {out}/old and {out}/new")
sys.exit(1 if ndiff else 0)
PY
rc=$?
echo "same_behaviour.sh: $((SECONDS - t0)) s" >&2
exit $rc
