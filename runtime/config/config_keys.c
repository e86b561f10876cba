/*
 * config_keys.c - the config key table (config_impl.h): one row per key (path,
 * type, bounds, flags, default, target field, help), as redis' standardConfig. The
 * model.* rows come from the models (runtime/model/model.h: each model's
 * dt_model_ops.keys, model.type's names from the registry); the table is assembled
 * once, in dt_config_keys_init_(). Also here: path lookup, typo suggestions, the
 * DeepSpeed keys accepted and ignored, the JSON dump of a resolved config and
 * `dtrun config --keys`.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h" /* defines: dt_xstrdup */
#include "runtime/config/config_impl.h"

/* ---- enum names --------------------------------------------------------- */

#define NAME_(n, s) s,
static const char *const optim_names[] = {DT_OPTIM_TYPE_MAP(NAME_) NULL};
static const char *const sched_names[] = {DT_SCHED_TYPE_MAP(NAME_) NULL};
static const char *const warmup_names[] = {DT_WARMUP_TYPE_MAP(NAME_) NULL};
static const char *const dtype_names[] = {DT_DTYPE_MAP(NAME_) NULL};
static const char *const device_names[] = {DT_DEVICE_MAP(NAME_) NULL};
static const char *const offload_names[] = {DT_OFFLOAD_DEVICE_MAP(NAME_) NULL};
static const char *const backend_names[] = {DT_COMM_BACKEND_MAP(NAME_) NULL};
/* the owners' names: runtime/layout/pp_sched.h, runtime/model/model.h (the strategy's:
 * the strategy table's dt_strategy_names) */
static const char *const pp_schedule_names[] = {DT_PP_SCHEDULE_MAP(NAME_) NULL};
static const char *const pp_partition_names[] = {DT_PP_PARTITION_MAP(NAME_) NULL};
static const char *const cp_mode_names[] = {"ring", "ulysses", NULL};
static const char *const recompute_names[] = {DT_MODEL_RECOMPUTE_MAP(NAME_) NULL};
static const char *const lora_base_names[] = {DT_CONFIG_LORA_BASE_MAP(NAME_) NULL};
#undef NAME_

const char *dt_config_strategy_name(dt_strategy_t s) { return dt_strategy_name(s); }

const char *dt_config_sched_name(dt_sched_type_t s) {
    return (unsigned)s < sizeof sched_names / sizeof *sched_names - 1 ? sched_names[s] : "?";
}

/* Enum fields are written through an int pointer. */
_Static_assert(sizeof(dt_strategy_t) == sizeof(int) && sizeof(dt_pp_schedule_t) == sizeof(int) &&
                   sizeof(dt_pp_partition_t) == sizeof(int) && sizeof(dt_model_recompute_t) == sizeof(int),
               "enum fields must be int-sized");

/* ---- the table ---------------------------------------------------------- */

static const char *const key_type_names[] = {"bool", "int", "float", "string", "enum",
                                             "[float,float]"};

#define OFF(field) offsetof(dt_config_t, field)

/* The most micro-batches per optimizer step: far above any real run, and low
 * enough that micro * accumulation * world size stays a sane batch (2^31 - 1 was
 * accepted, and a run would have taken years per step). */
#define MAX_ACCUM 65536

static const config_key_t head_keys[] = {
    /* DeepSpeed's keys */
    {"train_batch_size", KT_INT, OFF(train_batch_size), 1, I32, KF_DS | KF_DERIVED, NULL,
     "\"auto\"", "global batch in samples = micro * accumulation * world size (--nnodes MIN:MAX keeps the run's "
     "across resizes: accumulation is recomputed; README Elastic runs)"},
    {"train_micro_batch_size_per_gpu", KT_INT, OFF(train_micro_batch_size_per_gpu), 1, I32,
     KF_DS | KF_DERIVED, NULL, "\"auto\"", "samples per rank per forward/backward"},
    {"gradient_accumulation_steps", KT_INT, OFF(gradient_accumulation_steps), 1, MAX_ACCUM,
     KF_DS | KF_DERIVED, NULL, "\"auto\"", "micro-batches per optimizer step"},
    {"gradient_clipping", KT_FLOAT, OFF(gradient_clipping), 0, INFINITY, KF_DS, NULL, "1.0",
     "clip the global gradient norm to this (0 = off)"},
    {"steps_per_print", KT_INT, OFF(steps_per_print), 1, I32, KF_DS, NULL, "10",
     "a metrics line every N steps (and at the last)"},
    {"optimizer.type", KT_ENUM, OFF(optimizer.type), 0, 0, KF_DS, optim_names, "\"AdamW\"",
     "optimizer"},
    {"optimizer.params.lr", KT_FLOAT, OFF(optimizer.lr), 0, INFINITY, KF_DS | KF_MIN_EXCL, NULL,
     "0.001", "learning rate (the peak when a scheduler warms up)"},
    {"optimizer.params.betas", KT_FLOAT2, OFF(optimizer.betas), 0, 1, KF_DS | KF_MAX_EXCL, NULL,
     "[0.9, 0.999]", "Adam beta1, beta2"},
    {"optimizer.params.eps", KT_FLOAT, OFF(optimizer.eps), 0, INFINITY, KF_DS | KF_MIN_EXCL,
     NULL, "1e-08", "Adam epsilon"},
    {"optimizer.params.weight_decay", KT_FLOAT, OFF(optimizer.weight_decay), 0, INFINITY, KF_DS,
     NULL, "0.01", "weight decay (decoupled unless Adam with adam_w_mode false)"},
    {"optimizer.params.adam_w_mode", KT_BOOL, OFF(optimizer.adam_w_mode), 0, 0, KF_DS, NULL,
     "true", "type Adam: decoupled decay as AdamW (DeepSpeed's default); false: L2"},
    {"optimizer.params.decay_embeddings", KT_BOOL, OFF(optimizer.decay_embeddings), 0, 0, 0,
     NULL, "false", "decay embeddings too (biases and LayerNorm never decay)"},
    {"scheduler.type", KT_ENUM, OFF(scheduler.type), 0, 0, KF_DS, sched_names, "\"none\"",
     "learning-rate schedule (none = constant lr)"},
    {"scheduler.params.warmup_min_lr", KT_FLOAT, OFF(scheduler.warmup_min_lr), 0, INFINITY,
     KF_DS, NULL, "0", "WarmupLR/WarmupDecayLR: lr at step 0"},
    {"scheduler.params.warmup_max_lr", KT_FLOAT, OFF(scheduler.warmup_max_lr), 0, INFINITY,
     KF_DS | KF_DERIVED, NULL, "\"auto\"",
     "WarmupLR/WarmupDecayLR: lr after warmup (default optimizer.params.lr)"},
    {"scheduler.params.warmup_num_steps", KT_INT, OFF(scheduler.warmup_num_steps), 1, I32, KF_DS,
     NULL, "1000", "steps of warmup"},
    {"scheduler.params.warmup_type", KT_ENUM, OFF(scheduler.warmup_type), 0, 0, KF_DS,
     warmup_names, "\"log\"", "warmup curve"},
    {"scheduler.params.total_num_steps", KT_INT, OFF(scheduler.total_num_steps), 1, I32,
     KF_DS | KF_DERIVED, NULL, "\"auto\"",
     "WarmupDecayLR/WarmupCosineLR: end of the decay (default train_steps)"},
    {"scheduler.params.warmup_min_ratio", KT_FLOAT, OFF(scheduler.warmup_min_ratio), 0, 1, KF_DS,
     NULL, "0", "WarmupCosineLR: lr ratio at step 0"},
    {"scheduler.params.cos_min_ratio", KT_FLOAT, OFF(scheduler.cos_min_ratio), 0, 1, KF_DS, NULL,
     "0.0001", "WarmupCosineLR: lr ratio at total_num_steps"},
    {"bf16.enabled", KT_BOOL, OFF(bf16.enabled), 0, 0, KF_DS, NULL, "false",
     "bf16 parameters and compute with fp32 master weights (GPU)"},
    {"bf16.stochastic_rounding", KT_BOOL, OFF(bf16.stochastic_rounding), 0, 0, 0, NULL, "false",
     "round the bf16 parameters written from the fp32 masters stochastically (deterministic per seed "
     "and step) instead of to nearest"},
    {"communication_data_type", KT_ENUM, OFF(communication_data_type), 0, 0, KF_DS, dtype_names,
     "\"fp32\"", "type of gradients on the wire"},
    {"zero_optimization.stage", KT_INT, OFF(zero.stage), 0, 3, KF_DS, NULL, "0",
     "ZeRO stage; the same thing as strategy (0 ddp, 1 zero1, 2 zero2, 3 fsdp)"},
    {"zero_optimization.overlap_comm", KT_BOOL, OFF(zero.overlap_comm), 0, 0, KF_DS, NULL,
     "true", "overlap gradient communication with the backward pass"},
    {"zero_optimization.reduce_bucket_size", KT_INT, OFF(zero.reduce_bucket_size), 1, BIG, KF_DS,
     NULL, "6553600", "elements per gradient bucket (25 MiB of fp32, as PyTorch DDP)"},
    {"zero_optimization.allgather_bucket_size", KT_INT, OFF(zero.allgather_bucket_size), 1, BIG,
     KF_DS, NULL, "6553600", "elements per parameter all-gather bucket"},
    {"zero_optimization.contiguous_gradients", KT_BOOL, OFF(zero.contiguous_gradients), 0, 0,
     KF_DS, NULL, "true", "gradients in one contiguous buffer"},
    {"zero_optimization.reduce_scatter", KT_BOOL, OFF(zero.reduce_scatter), 0, 0, KF_DS, NULL,
     "true", "stages 1-2: reduce-scatter gradients instead of all-reduce"},
    {"zero_optimization.allgather_partitions", KT_BOOL, OFF(zero.allgather_partitions), 0, 0,
     KF_DS, NULL, "true", "stages 1-2: all-gather updated parameters"},
    {"zero_optimization.stage3_prefetch_bucket_size", KT_INT,
     OFF(zero.stage3_prefetch_bucket_size), 0, BIG, KF_DS, NULL, "50000000",
     "stage 3: elements of parameters gathered ahead of use"},
    {"zero_optimization.stage3_param_persistence_threshold", KT_INT,
     OFF(zero.stage3_param_persistence_threshold), 0, BIG, KF_DS, NULL, "100000",
     "stage 3: tensors smaller than this stay unsharded"},
    {"zero_optimization.offload_optimizer.device", KT_ENUM, OFF(zero.offload_optimizer.device), 0, 0, KF_DS,
     offload_names, "\"none\"",
     "cpu: fp32 master weights and Adam state of each rank's shard in host memory, AdamW on the CPU "
     "(stages 1-3 on a GPU; no effect on the CPU device)"},
    {"zero_optimization.offload_optimizer.pin_memory", KT_BOOL, OFF(zero.offload_optimizer.pin_memory), 0, 0,
     KF_DS, NULL, "true", "offloaded state in page-locked host memory, so gradient and parameter copies "
     "overlap the compute"},

    /* dtrun's own keys */
    /* model.type, then every registered model's keys: see dt_config_keys_init_() */
};

/* The rows after the model's. */
static const config_key_t tail_keys[] = {
    {"model.pretrained", KT_STRING, OFF(model_pretrained), 0, 0, KF_PATH, NULL, "null",
     "a Hugging Face directory (config.json + safetensors): the model and its initial weights"},
    {"data.train", KT_STRING, OFF(data.train), 0, 0, KF_PATH | KF_SOURCES, NULL, "null",
     "training data: a path or glob (text = bytes, or .bin token shards), or a weighted "
     "mixture [{\"path\": GLOB, \"weight\": W}, ...]"},
    {"data.val", KT_STRING, OFF(data.val), 0, 0, KF_PATH, NULL, "null",
     "validation data: a path or glob (null = tail of train)"},
    {"data.val_fraction", KT_FLOAT, OFF(data.val_fraction), 0, 1, KF_MAX_EXCL, NULL, "0.1",
     "share of train (of each source) held out for validation when data.val is null"},
    {"data.prefetch", KT_INT, OFF(data.prefetch), 0, 64, 0, NULL, "2",
     "micro-batches read ahead on a background thread (0 = read when the step needs them)"},
    {"data.packing", KT_BOOL, OFF(data.packing), 0, 0, 0, NULL, "true",
     "masked data (`dtrun tokenize --chat`): pack several documents into each sequence, each "
     "attending only to itself (false = one document per sequence, padded)"},
    {"train_steps", KT_INT, OFF(train_steps), 1, BIG, 0, NULL, "1000", "optimizer steps"},
    {"seed", KT_INT, OFF(seed), 0, BIG, 0, NULL, "1337", "seed of init and data order"},
    {"device", KT_ENUM, OFF(device), 0, 0, 0, device_names, "\"auto\"",
     "auto = cuda when a GPU is there, else cpu"},
    {"strategy", KT_ENUM, OFF(strategy), 0, 0, 0, dt_strategy_names, "\"ddp\"",
     "data parallelism; the same thing as zero_optimization.stage"},
    {"tensor_parallel.size", KT_INT, OFF(tp.size), 1, I32, 0, NULL, "1",
     "tensor-parallel ranks per model piece (1 = off): consecutive local ranks of one node, so it "
     "divides nproc_per_node; world = size x data-parallel ranks (DeepSpeed's "
     "tensor_parallel.autotp_size is the same key)"},
    {"tensor_parallel.sequence_parallel", KT_BOOL, OFF(tp.sequence_parallel), 0, 0, 0, NULL, "false",
     "cut the activations between tensor-parallel regions along the sequence (all-gather and "
     "reduce-scatter instead of all-reduce); no effect when tensor_parallel.size is 1"},
    {"context_parallel.size", KT_INT, OFF(cp.size), 1, 4096, 0, NULL, "1",
     "context-parallel ranks per sequence (1 = off): each holds 1/size of every sequence's tokens "
     "through the whole model (the chunks r and 2 size - 1 - r of 2 size: equal causal work), and "
     "attention passes key/value blocks around them (ring attention); model.seq_len must be a multiple "
     "of 2 x size; world = tensor_parallel.size x size x pipeline.stages x data-parallel ranks"},
    {"context_parallel.mode", KT_ENUM, OFF(cp.mode), 0, 0, 0, cp_mode_names, "\"ring\"",
     "ring (key/value blocks passed around the ranks while each computes; any head count) or ulysses "
     "(all-to-all: each rank attends over whole sequences for heads / size of the heads; the query and "
     "key/value heads per tensor-parallel rank must divide by size)"},
    {"pipeline.stages", KT_INT, OFF(pp.stages), 1, I32, 0, NULL, "1",
     "pipeline-parallel stages (1 = off): each holds consecutive blocks (the embedding on the first, the "
     "head on the last); world = tensor_parallel.size x stages x data-parallel ranks"},
    {"pipeline.schedule", KT_ENUM, OFF(pp.schedule), 0, 0, 0, pp_schedule_names, "\"1f1b\"",
     "gpipe (all forwards, then all backwards), 1f1b (at most stages micro-batches in flight; needs "
     "gradient_accumulation_steps >= stages), interleaved (1f1b over virtual_stages chunks per rank)"},
    {"pipeline.virtual_stages", KT_INT, OFF(pp.virtual_stages), 1, 64, 0, NULL, "1",
     "model chunks per pipeline rank (the interleaved schedule; >= 2 there, 1 otherwise)"},
    {"pipeline.partition", KT_ENUM, OFF(pp.partition), 0, 0, 0, pp_partition_names, "\"uniform\"",
     "how blocks are cut into stages: uniform (equal block counts), parameters or flops (balanced, the "
     "embedding counted on the first stage and the head on the last)"},
    {"activation_checkpointing.policy", KT_ENUM, OFF(recompute.policy), 0, 0, 0, recompute_names, "\"none\"",
     "activation recomputation: none; selective (keep each block's GEMM outputs, recompute norms, attention "
     "and the MLP activation in backward); full (keep each block's input only, rerun its forward in "
     "backward); any DeepSpeed key of the section without a policy means full"},
    {"activation_checkpointing.every", KT_INT, OFF(recompute.every), 1, I32, 0, NULL, "1",
     "checkpoint every K-th block of each chunk only (blocks j with j % K == 0; 1 = every block), the "
     "rest stored normally"},
    {"activation_checkpointing.number_checkpoints", KT_INT, OFF(recompute.number_checkpoints), 0, I32, KF_DS,
     NULL, "0", "DeepSpeed's; has an effect: N checkpointed blocks, every = ceil(layers / N) unless every "
     "is given (0 = not set)"},
    {"activation_checkpointing.partition_activations", KT_BOOL, OFF(recompute.partition_activations), 0, 0,
     KF_DS, NULL, "false", "DeepSpeed's; accepted, no effect (a warning): checkpoints are not split over TP ranks"},
    {"activation_checkpointing.cpu_checkpointing", KT_BOOL, OFF(recompute.cpu_checkpointing), 0, 0, KF_DS, NULL,
     "false", "DeepSpeed's; accepted, no effect (a warning): checkpoints stay in device memory"},
    {"activation_checkpointing.contiguous_memory_optimization", KT_BOOL,
     OFF(recompute.contiguous_memory_optimization), 0, 0, KF_DS, NULL, "false",
     "DeepSpeed's; accepted, no effect (a warning): the arena is one contiguous buffer already"},
    {"activation_checkpointing.synchronize_checkpoint_boundary", KT_BOOL,
     OFF(recompute.synchronize_checkpoint_boundary), 0, 0, KF_DS, NULL, "false",
     "DeepSpeed's; accepted, no effect (a warning)"},
    {"activation_checkpointing.profile", KT_BOOL, OFF(recompute.profile), 0, 0, KF_DS, NULL, "false",
     "DeepSpeed's; accepted, no effect (a warning)"},
    {"lora.r", KT_INT, OFF(lora.r), 0, 65536, 0, NULL, "0",
     "LoRA rank (0 = off: full fine-tuning); needs model.pretrained: its weights are the frozen base, "
     "only the adapters A (r, in) and B (out, r) are trained (PEFT's math: y = W x + alpha/r B A x)"},
    {"lora.alpha", KT_FLOAT, OFF(lora.alpha), 0, 1e9, KF_MIN_EXCL, NULL, "8",
     "LoRA scaling: the adapters' output is multiplied by alpha / r (PEFT's lora_alpha)"},
    {"lora.dropout", KT_FLOAT, OFF(lora.dropout), 0, 1, KF_MAX_EXCL, NULL, "0",
     "dropout on the adapters' input (PEFT's lora_dropout): only 0 is implemented"},
    {"lora.target_modules", KT_STRING, OFF(lora.target_modules), 0, 0, KF_LIST, NULL, "null",
     "the modules that get adapters, PEFT's names: a list or \"a,b\" (llama: q_proj k_proj v_proj o_proj "
     "gate_proj up_proj down_proj; gpt: c_attn c_proj c_fc); null = PEFT's default (llama q_proj,v_proj; "
     "gpt c_attn)"},
    {"lora.base_dtype", KT_ENUM, OFF(lora.base_dtype), 0, 0, 0, lora_base_names, "\"auto\"",
     "how the frozen base's linear weights are stored: int8 (per-output-row absmax, dequantized in the "
     "matmul), or the compute dtype (fp32 on cpu, bf16 on cuda); auto = the compute dtype"},
    {"lora.init", KT_STRING, OFF(lora.init), 0, 0, KF_PATH, NULL, "null",
     "a PEFT adapter to start from (its directory, or its adapter_model.safetensors); null = PEFT's "
     "initialisation (A Kaiming-uniform, B zero) from seed"},
    {"checkpoint.dir", KT_STRING, OFF(checkpoint.dir), 0, 0, KF_PATH, NULL, "\"runs/ckpt\"",
     "checkpoint folder"},
    {"checkpoint.every_steps", KT_INT, OFF(checkpoint.every_steps), 0, BIG, 0, NULL, "0",
     "save every N steps (0 = never)"},
    {"checkpoint.keep_last", KT_INT, OFF(checkpoint.keep_last), 0, I32, 0, NULL, "3",
     "keep the newest N checkpoints (0 = all)"},
    {"checkpoint.resume", KT_STRING, OFF(checkpoint.resume), 0, 0, 0, NULL, "\"auto\"",
     "auto (latest in dir, if any) | never | a checkpoint path"},
    {"checkpoint.overwrite", KT_BOOL, OFF(checkpoint.overwrite), 0, 0, 0, NULL, "false",
     "with resume never, save into a dir that already holds checkpoints (else exit 2); keep_last "
     "deletes only this run's"},
    {"checkpoint.async", KT_BOOL, OFF(checkpoint.async), 0, 0, 0, NULL, "false",
     "periodic saves copy the shard to host memory (pinned on CUDA) and a background thread writes, "
     "checksums and fsyncs it while training goes on; the final and preemption saves stay synchronous"},
    {"eval.every_steps", KT_INT, OFF(eval.every_steps), 0, BIG, 0, NULL, "100",
     "validation every N steps (0 = never)"},
    {"eval.batches", KT_INT, OFF(eval.batches), 1, I32, 0, NULL, "10",
     "micro-batches per evaluation"},
    {"log.dir", KT_STRING, OFF(log.dir), 0, 0, KF_PATH, NULL, "\"runs/log\"",
     "metrics.jsonl, summary.json and the resolved config"},
    {"log.trace", KT_BOOL, OFF(log.trace), 0, 0, 0, NULL, "false",
     "every rank records its steps' phases, data waits, collectives and point-to-point ops, pipeline waits "
     "and checkpoint writes (clocks aligned to rank 0's): <log.dir>/trace/rank_<r>.json, merged into "
     "<log.dir>/trace.json (Chrome/Perfetto trace events); dtrun report --step N draws one step"},
    {"log.trace_steps", KT_INT, OFF(log.trace_steps), 2, 100000, 0, NULL, "20",
     "log.trace keeps the last N steps (a ring: bounded memory)"},
    {"tensorboard.enabled", KT_BOOL, OFF(tensorboard.enabled), 0, 0, KF_DS, NULL, "false",
     "rank 0 writes TensorBoard event files (the metrics.jsonl figures as scalars, the resolved "
     "config as text), flushed at every logged step; a resumed run continues the same curves"},
    {"tensorboard.output_path", KT_STRING, OFF(tensorboard.output_path), 0, 0, KF_DS, NULL, "\"\"",
     "folder of the event files' job folder (\"\": log.dir)"},
    {"tensorboard.job_name", KT_STRING, OFF(tensorboard.job_name), 0, 0, KF_DS, NULL, "\"tensorboard\"",
     "the event files go in <output_path>/<job_name>/ (one folder name)"},
    {"comm.backend", KT_ENUM, OFF(comm.backend), 0, 0, 0, backend_names, "\"auto\"",
     "communicator (auto: nccl on GPUs, shm in a node, hier across nodes)"},
    {"comm.timeout_s", KT_FLOAT, OFF(comm.timeout_s), 0, 1e6, KF_MIN_EXCL, NULL, "300",
     "a collective waiting longer is a hang: the op fails, the agent dumps every rank's flight "
     "recorder to <log_dir>/<run id>/flight/ and names the rank that never arrived (NCCL: the "
     "watchdog aborts the communicator)"},
    {"sample_tokens", KT_INT, OFF(sample_tokens), 0, 100000, 0, NULL, "0",
     "characters generated from the trained model at the end (text data only)"},
    {"threads", KT_INT, OFF(threads), 0, 4096, 0, NULL, "0",
     "CPU threads per rank (0 = cores / local ranks)"},
};

/* The table: head_keys, model.type, each model's keys (runtime/model/registry.c
 * order, a path two models share listed once), tail_keys. Built once. */
#define MAX_MODELS 32
config_key_t dt_config_keys_[DT_CONFIG_MAX_KEYS];
int dt_config_n_keys_;
static const char *model_names[MAX_MODELS + 1];
static char model_help[512];

static void add_row(const config_key_t *k) {
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(KEYS[i].path, k->path)) return;
    if (N_KEYS == DT_CONFIG_MAX_KEYS) abort(); /* a bug: raise DT_CONFIG_MAX_KEYS */
    KEYS[N_KEYS++] = *k;
}

static void build_keys(void) {
    for (size_t i = 0; i < sizeof head_keys / sizeof head_keys[0]; i++) add_row(&head_keys[i]);
    int nm = dt_model_count() < MAX_MODELS ? dt_model_count() : MAX_MODELS;
    size_t h = 0;
    for (int m = 0; m < nm; m++) { /* "gpt (GPT-2 on text/tokens) or mlp (synthetic data)" */
        const dt_model_ops *ops = dt_model_at(m);
        model_names[m] = ops->name;
        const char *sep = m == 0 ? "" : m == nm - 1 ? " or " : ", ";
        h += (size_t)snprintf(model_help + h, h < sizeof model_help ? sizeof model_help - h : 0, "%s%s (%s)",
                              sep, ops->name, ops->help);
    }
    config_key_t type = {"model.type", KT_ENUM, OFF(model_type), 0, 0, 0, model_names, "\"mlp\"",
                         model_help};
    add_row(&type);
    for (int m = 0; m < nm; m++) {
        const dt_model_ops *ops = dt_model_at(m);
        for (int i = 0; i < ops->n_keys; i++) {
            const dt_model_key *mk = &ops->keys[i];
            /* INT and BOOL model keys are int fields (KF_INT32); FLOAT ones doubles */
            key_type_t type = mk->kind == DT_MODEL_KEY_FLOAT ? KT_FLOAT
                              : mk->kind == DT_MODEL_KEY_BOOL ? KT_BOOL
                                                              : KT_INT;
            unsigned flags = mk->kind == DT_MODEL_KEY_FLOAT ? 0 : KF_INT32;
            config_key_t k = {mk->path, type, OFF(model) + mk->offset, mk->min, mk->max, flags, NULL,
                              mk->def, mk->help};
            add_row(&k);
        }
    }
    for (size_t i = 0; i < sizeof tail_keys / sizeof tail_keys[0]; i++) add_row(&tail_keys[i]);
}

static pthread_once_t keys_once = PTHREAD_ONCE_INIT;
void dt_config_keys_init_(void) { pthread_once(&keys_once, build_keys); }

/* DeepSpeed keys (and everything under them) that dtrun accepts and ignores. */
static const char *const ignored_keys[] = {
    "fp16", "amp", "torch_autocast", "wall_clock_breakdown", "memory_breakdown", "dump_state",
    "disable_python_gc", "log_level", "flops_profiler",
    "wandb", "csv_monitor", "comet", "comms_logger", "monitor_config",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "prescale_gradients",
    "gradient_predivide_factor", "gradient_allreduce_op", "sparse_gradients",
    "sparse_attention", "disable_allgather", "elasticity", "pipeline", "aio", "autotuning",
    "compression_training", "data_efficiency", "curriculum_learning", "quantize_training",
    "data_types", "dataloader_drop_last", "nebula", "eigenvalue", "progressive_layer_drop",
    "hybrid_engine", "seq_parallel_communication_data_type", "managed_gradient_accumulation",
    "use_data_before_expert_parallelism", "vocabulary_size", "weight_quantization", "compile",
    "timers", "graph_harvesting", "checkpoint.tag_validation", "checkpoint.load_universal",
    "checkpoint.use_node_local_storage", "checkpoint.parallel_write",
    "optimizer.legacy_fusion", "optimizer.params.torch_adam",     "optimizer.params.bias_correction", "optimizer.params.amsgrad", "optimizer.params.fused",
    "scheduler.params.last_batch_iteration", "bf16.check_overflow",
    "bf16.immediate_grad_update", "bf16.bf16_master_weights_and_grads",
    "bf16.bf16_optimizer_states", "bf16.auto_cast", "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.offload_optimizer.buffer_count", "zero_optimization.offload_optimizer.fast_init",
    "zero_optimization.offload_optimizer.pipeline", "zero_optimization.offload_optimizer.pipeline_read",
    "zero_optimization.offload_optimizer.pipeline_write", "zero_optimization.offload_optimizer.ratio",
    "zero_optimization.offload_param", "zero_optimization.sub_group_size",
    "zero_optimization.cpu_offload", "zero_optimization.cpu_offload_param",
    "zero_optimization.cpu_offload_use_pin_memory", "zero_optimization.load_from_fp32_weights",
    "zero_optimization.elastic_checkpoint", "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "zero_optimization.stage3_model_persistence_threshold",
    "zero_optimization.stage3_module_granularity_threshold",
    "zero_optimization.stage3_use_all_reduce_for_fetch_params",
    "zero_optimization.stage3_allgather_sequential", "zero_optimization.ignore_unused_parameters",
    "zero_optimization.legacy_stage1", "zero_optimization.round_robin_gradients",
    "zero_optimization.use_multi_rank_bucket_allreduce", "zero_optimization.compute_grad_norm",
    "zero_optimization.parameter_alignment", "zero_optimization.zero_hpz_partition_size",
    "zero_optimization.zero_quantized_weights",
    "zero_optimization.zero_quantized_nontrainable_weights",
    "zero_optimization.zero_quantized_gradients", "zero_optimization.memory_efficient_linear",
    "zero_optimization.pipeline_loading_checkpoint", "zero_optimization.override_module_apply",
    "zero_optimization.log_trace_cache_warnings", "zero_optimization.enable_sanity_checks",
    "zero_optimization.mics_shard_size", "zero_optimization.mics_hierarchical_params_gather",
    "zero_optimization.zenflow", "zero_optimization.leaf_module",
    "zero_optimization.save_muon_momentum_buffer_in_memory",
};
#define N_IGNORED ((int)(sizeof ignored_keys / sizeof ignored_keys[0]))

/* Other names of keys: DeepSpeed's name where dtrun's differs. Not rows (the dump
 * and --keys show the key once, its help names the alias); config.c sets the key's
 * row for either name and refuses both given with different values. */
static const struct {
    const char *alias, *key;
} key_aliases[] = {
    {"tensor_parallel.autotp_size", "tensor_parallel.size"},
};
#define N_ALIASES ((int)(sizeof key_aliases / sizeof key_aliases[0]))

/* ---- table helpers ------------------------------------------------------ */

const char *dt_config_alias_(const char *path) {
    for (int i = 0; i < N_ALIASES; i++)
        if (!strcmp(key_aliases[i].alias, path)) return key_aliases[i].key;
    return NULL;
}

const char *dt_config_key_alias_(const char *key) {
    for (int i = 0; i < N_ALIASES; i++)
        if (!strcmp(key_aliases[i].key, key)) return key_aliases[i].alias;
    return NULL;
}

int dt_config_key_find_(const char *path) {
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(KEYS[i].path, path)) return i;
    return -1;
}

/* True when path is a section: a proper prefix (at a dot) of some key. */
bool dt_config_is_section_(const char *path) {
    size_t n = strlen(path);
    for (int i = 0; i < N_KEYS; i++)
        if (!strncmp(KEYS[i].path, path, n) && KEYS[i].path[n] == '.') return true;
    return false;
}

bool dt_config_is_ignored_(const char *path) {
    for (int i = 0; i < N_IGNORED; i++) {
        size_t n = strlen(ignored_keys[i]);
        if (!strncmp(path, ignored_keys[i], n) && (path[n] == '\0' || path[n] == '.'))
            return true;
    }
    return false;
}

static int edit_distance(const char *a, const char *b) {
    size_t m = strlen(a), n = strlen(b);
    if (m > 200 || n > 200) return 1000;
    int prev[201], cur[201];
    for (size_t j = 0; j <= n; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= m; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= n; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (n + 1));
    }
    return prev[n];
}

static void consider(const char *path, const char *cand, size_t cand_len, int *best_d,
                     char *best, size_t best_size) {
    char buf[256];
    if (cand_len >= sizeof buf) return;
    memcpy(buf, cand, cand_len);
    buf[cand_len] = '\0';
    int d = edit_distance(path, buf);
    /* a key cut short ("train_micro_batch_size") is as good as a one-letter typo */
    size_t plen = strlen(path);
    if (plen >= 4 && plen < cand_len && !strncmp(buf, path, plen) && buf[plen] == '_') d = 1;
    if (d < *best_d) {
        *best_d = d;
        snprintf(best, best_size, "%s", buf);
    }
}

/* The known key or section closest to path, if close enough to be a typo. */
bool dt_config_suggest_(const char *path, char *out, size_t out_size) {
    int best_d = 1 << 30;
    out[0] = '\0';
    for (int i = 0; i < N_KEYS; i++) {
        const char *k = KEYS[i].path;
        consider(path, k, strlen(k), &best_d, out, out_size);
        for (const char *dot = strchr(k, '.'); dot; dot = strchr(dot + 1, '.'))
            consider(path, k, (size_t)(dot - k), &best_d, out, out_size);
    }
    for (int i = 0; i < N_IGNORED; i++)
        consider(path, ignored_keys[i], strlen(ignored_keys[i]), &best_d, out, out_size);
    for (int i = 0; i < N_ALIASES; i++)
        consider(path, key_aliases[i].alias, strlen(key_aliases[i].alias), &best_d, out, out_size);
    size_t len = strlen(out);
    return best_d > 0 && (best_d <= 2 || (size_t)best_d * 3 <= len);
}

/* "an integer >= 1", "a number in [0, 1)", "true or false", "one of ...". */
void dt_config_expected_(const config_key_t *k, char *out, size_t size) {
    const char *what = k->type == KT_INT ? "an integer" : "a number";
    switch (k->type) {
    case KT_BOOL: snprintf(out, size, "true or false"); return;
    case KT_STRING:
        snprintf(out, size, "%s",
                 (k->flags & KF_PATH) ? "a non-empty path string"
                 : (k->flags & KF_LIST) ? "a list of names or a string \"a,b\""
                                        : "a string");
        return;
    case KT_ENUM: {
        size_t n = (size_t)snprintf(out, size, "one of");
        for (int i = 0; k->names[i] && n < size; i++)
            n += (size_t)snprintf(out + n, size - n, "%s \"%s\"", i ? "," : "", k->names[i]);
        return;
    }
    case KT_FLOAT2: what = "a list of 2 numbers"; break;
    default: break;
    }
    const char *lo = (k->flags & KF_MIN_EXCL) ? "(" : "[";
    const char *hi = (k->flags & KF_MAX_EXCL) ? ")" : "]";
    bool has_max = isfinite(k->max) && k->max != BIG && k->max != I32;
    if (has_max)
        snprintf(out, size, "%s in %s%g, %g%s", what, lo, k->min, k->max, hi);
    else
        snprintf(out, size, "%s %s %g", what, (k->flags & KF_MIN_EXCL) ? ">" : ">=", k->min);
}

/* ---- dump and listing --------------------------------------------------- */

static cJSON *value_json(const dt_config_t *cfg, int row) {
    const config_key_t *k = &KEYS[row];
    const void *f = cfield(cfg, k);
    switch (k->type) {
    case KT_BOOL: return cJSON_CreateBool((k->flags & KF_INT32) ? *(const int *)f != 0 : *(const bool *)f);
    case KT_INT: {
        int64_t x = (k->flags & KF_INT32) ? *(const int *)f : *(const int64_t *)f;
        if ((k->flags & KF_DERIVED) && x == 0 && cfg->origin[row] == DT_CONFIG_ORIGIN_DEFAULT)
            return cJSON_CreateString("auto");
        return cJSON_CreateNumber((double)x);
    }
    case KT_FLOAT: {
        double x = *(const double *)f;
        if ((k->flags & KF_DERIVED) && x == 0 && cfg->origin[row] == DT_CONFIG_ORIGIN_DEFAULT)
            return cJSON_CreateString("auto");
        return cJSON_CreateNumber(x);
    }
    case KT_FLOAT2: return cJSON_CreateDoubleArray((const double *)f, 2);
    case KT_STRING: {
        const char *s = *(char *const *)f;
        if ((k->flags & KF_LIST) && s) { /* back as the list it was given as */
            cJSON *list = cJSON_CreateArray();
            char *copy = dt_xstrdup(s), *save = NULL;
            for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
                cJSON_AddItemToArray(list, cJSON_CreateString(tok));
            free(copy);
            return list;
        }
        if ((k->flags & KF_SOURCES) && cfg->data.n_sources > 0) {
            cJSON *list = cJSON_CreateArray();
            for (int i = 0; i < cfg->data.n_sources; i++) {
                cJSON *item = cJSON_CreateObject();
                cJSON_AddStringToObject(item, "path", cfg->data.sources[i].path);
                cJSON_AddNumberToObject(item, "weight", cfg->data.sources[i].weight);
                cJSON_AddItemToArray(list, item);
            }
            return list;
        }
        return s ? cJSON_CreateString(s) : cJSON_CreateNull();
    }
    case KT_ENUM: return cJSON_CreateString(k->names[*(const int *)f]);
    }
    return cJSON_CreateNull();
}

char *dt_config_dump_json(const dt_config_t *cfg) {
    dt_config_keys_init_();
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    for (int i = 0; i < N_KEYS; i++) {
        /* walk or create the sections of the path */
        cJSON *obj = root;
        const char *p = KEYS[i].path;
        for (const char *dot; (dot = strchr(p, '.')); p = dot + 1) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(dot - p), p);
            cJSON *sub = cJSON_GetObjectItemCaseSensitive(obj, name);
            if (!sub) {
                sub = cJSON_CreateObject();
                cJSON_AddItemToObject(obj, name, sub);
            }
            obj = sub;
        }
        cJSON_AddItemToObject(obj, p, value_json(cfg, i));
    }
    char *out = cJSON_Print(root);
    cJSON_Delete(root);
    if (!out) return NULL;
    /* hand back memory the caller releases with free() */
    char *copy = dt_xstrdup(out);
    cJSON_free(out);
    return copy;
}

void dt_config_print_keys(FILE *out) {
    dt_config_keys_init_();
    fprintf(out, "%-52s %-14s %-14s %s\n", "KEY", "TYPE", "DEFAULT", "HELP");
    for (int i = 0; i < N_KEYS; i++) {
        const config_key_t *k = &KEYS[i];
        char type[160];
        if (k->type == KT_ENUM) {
            size_t n = 0;
            for (int j = 0; k->names[j] && n < sizeof type; j++)
                n += (size_t)snprintf(type + n, sizeof type - n, "%s%s", j ? "|" : "",
                                      k->names[j]);
        } else {
            snprintf(type, sizeof type, "%s", key_type_names[k->type]);
        }
        fprintf(out, "%-52s %-14s %-14s %s%s\n", k->path, type, k->def, k->help,
                (k->flags & KF_DS) ? " [DeepSpeed]" : "");
    }
}
