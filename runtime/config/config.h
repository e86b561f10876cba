/*
 * config.h - the training config: a plain struct filled from a JSON file,
 * `KEY=VALUE` overrides and defaults, all driven by one table in config.c.
 *
 * Key names follow DeepSpeed wherever DeepSpeed has one (train_batch_size,
 * optimizer.params.lr, scheduler.params.warmup_num_steps, zero_optimization.stage,
 * ...), dtrun's own keys cover the model, data, strategy, checkpoint, eval, log and
 * comm (docs/interface.md). `dtrun config --keys` lists every key with its type, default
 * and help.
 *
 * Life cycle:
 *
 *     dt_config_t cfg;
 *     if (dt_config_load(path, overrides, n, &cfg) != DT_STATUS_OK ||
 *         dt_config_resolve(&cfg, world_size) != DT_STATUS_OK)
 *         fputs(dt_config_errors(&cfg), stderr);      // every error, one per line
 *     ...
 *     dt_config_free(&cfg);                            // always, success or not
 *
 * Every error names the source (file or override), the key path, what was expected
 * and what was found: `configs/x.json: optimizer.params.lr: expected a number > 0,
 * found "abc"`. All errors are collected, not just the first.
 *
 * DeepSpeed keys that dtrun does not implement (fp16, wall_clock_breakdown,
 * zero_optimization.offload_optimizer, ...) are accepted and listed once in
 * dt_config_warnings(); keys nobody knows are errors with a "did you mean".
 *
 * "auto" (as the HF Trainer writes DeepSpeed configs) on any number, bool or enum
 * key means "not given": the key takes dtrun's default or is derived (batch sizes
 * from each other, warmup_max_lr from optimizer.params.lr, total_num_steps from
 * train_steps). On a path key "auto" is an error: dtrun cannot guess a path.
 */
#ifndef DT_RUNTIME_CONFIG_H
#define DT_RUNTIME_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h" /* defines: dt_status_t */
#include "kernels/kernels.h"       /* defines: dt_dtype_t */
#include "runtime/comm/comm.h"    /* defines: dt_comm_backend_t */
#include "runtime/layout/pp_sched.h" /* defines: dt_pp_schedule_t */
#include "runtime/layout/strategy.h" /* defines: dt_strategy_t, the strategy table */
#include "runtime/model/model.h"  /* defines: dt_model_spec, dt_model_ops, dt_model_recompute_t, dt_pp_partition_t */

/* X(enum suffix, name in JSON). The order is the numeric value. */
#define DT_OPTIM_TYPE_MAP(X) X(ADAMW, "AdamW") X(ADAM, "Adam")
#define DT_SCHED_TYPE_MAP(X)                                                 \
    X(NONE, "none") X(WARMUP_LR, "WarmupLR") X(WARMUP_DECAY_LR, "WarmupDecayLR") \
    X(WARMUP_COSINE_LR, "WarmupCosineLR")
#define DT_WARMUP_TYPE_MAP(X) X(LOG, "log") X(LINEAR, "linear")
#define DT_DTYPE_MAP(X) X(FP32, "fp32") X(BF16, "bf16")
#define DT_DEVICE_MAP(X) X(AUTO, "auto") X(CPU, "cpu") X(CUDA, "cuda")
/* zero_optimization.offload_optimizer.device: DeepSpeed's names; nvme is not offered */
#define DT_OFFLOAD_DEVICE_MAP(X) X(NONE, "none") X(CPU, "cpu")
/* The strategy and its ZeRO stage, pipeline.schedule, pipeline.partition and
 * activation_checkpointing.policy are their owners' enums and names:
 * runtime/layout/strategy.h (the strategy table), runtime/layout/pp_sched.h and
 * runtime/model/model.h. */

/* lora.base_dtype: auto = the compute dtype (cpu fp32, cuda bf16). */
#define DT_CONFIG_LORA_BASE_MAP(X) X(AUTO, "auto") X(FP32, "fp32") X(BF16, "bf16") X(INT8, "int8")
enum {
#define X(n, s) DT_CONFIG_LORA_BASE_##n,
    DT_CONFIG_LORA_BASE_MAP(X)
#undef X
};

/* context_parallel.mode: how attention crosses the CP group. */
enum { DT_CONFIG_CP_RING = 0, DT_CONFIG_CP_ULYSSES = 1 };

typedef enum dt_optim_type {
#define X(n, s) DT_OPTIM_##n,
    DT_OPTIM_TYPE_MAP(X)
#undef X
} dt_optim_type_t;
typedef enum dt_sched_type {
#define X(n, s) DT_SCHED_##n,
    DT_SCHED_TYPE_MAP(X)
#undef X
} dt_sched_type_t;
typedef enum dt_warmup_type {
#define X(n, s) DT_WARMUP_##n,
    DT_WARMUP_TYPE_MAP(X)
#undef X
} dt_warmup_type_t;
/* Prefixed DT_CONFIG_: kernels/kernels.h owns dt_dtype_t and dt_device_t. */
typedef enum dt_config_dtype {
#define X(n, s) DT_CONFIG_DTYPE_##n,
    DT_DTYPE_MAP(X)
#undef X
} dt_config_dtype_t;
typedef enum dt_config_device {
#define X(n, s) DT_CONFIG_DEVICE_##n,
    DT_DEVICE_MAP(X)
#undef X
} dt_config_device_t;
typedef enum dt_config_offload {
#define X(n, s) DT_CONFIG_OFFLOAD_##n,
    DT_OFFLOAD_DEVICE_MAP(X)
#undef X
} dt_config_offload_t;

/* Upper bound on the rows of the key table (checked at compile time in config.c). */
#define DT_CONFIG_MAX_KEYS 128

/* One source of a data.train mixture. */
typedef struct dt_config_source {
    char *path;    /* glob */
    double weight; /* > 0, unnormalised */
} dt_config_source;

#define DT_CONFIG_MAX_SOURCES 16

/* Where a key's value came from (dt_config_t.origin, per key row). A value given as
 * null or "auto" is the default's. */
typedef enum dt_config_origin {
    DT_CONFIG_ORIGIN_DEFAULT = 0, /* the key table's default, or derived (zeroed: every key) */
    DT_CONFIG_ORIGIN_FILE,        /* the config file (or the text given to load_string) */
    DT_CONFIG_ORIGIN_OVERRIDE,    /* a KEY=VALUE override (dt_config_load's, dt_config_set, an elastic resize) */
} dt_config_origin_t;

/* The resolved config. Strings are heap copies owned by the struct (NULL = unset).
 * Batch sizes are 0 until dt_config_resolve() derives them for a world size. */
typedef struct dt_config {
    /* DeepSpeed: batch identity train_batch_size = micro * accumulation * DP size,
     * DP size: the layout's (runtime/layout/layout.h) for the world size */
    int64_t train_batch_size;
    int64_t train_micro_batch_size_per_gpu;
    int64_t gradient_accumulation_steps;
    double gradient_clipping; /* max global grad norm; 0 = off */
    int64_t steps_per_print;  /* metrics line every N steps (and the last) */
    struct {
        dt_optim_type_t type;
        double lr;
        double betas[2];
        double eps;
        double weight_decay;
        /* Decoupled (AdamW) decay when type is AdamW, or Adam with adam_w_mode (true by
         * default, as in DeepSpeed); L2 added to the gradient for Adam with it false. */
        bool adam_w_mode;
        bool decay_embeddings; /* weight decay on embeddings too; biases/LN never */
    } optimizer;
    struct {
        dt_sched_type_t type; /* DT_SCHED_NONE: constant optimizer.lr */
        double warmup_min_lr;
        double warmup_max_lr; /* default: optimizer.lr */
        int64_t warmup_num_steps;
        dt_warmup_type_t warmup_type;
        int64_t total_num_steps; /* default: train_steps */
        double warmup_min_ratio;
        double cos_min_ratio;
    } scheduler;
    struct {
        bool enabled;
        bool stochastic_rounding; /* dtrun's: bf16 parameters from the fp32 masters */
    } bf16;
    dt_config_dtype_t communication_data_type;
    struct {
        int64_t stage; /* 0-3, always equal to the stage of `strategy` */
        bool overlap_comm;
        int64_t reduce_bucket_size; /* elements, as in DeepSpeed */
        int64_t allgather_bucket_size; /* elements */
        bool contiguous_gradients;
        bool reduce_scatter;
        bool allgather_partitions;
        int64_t stage3_prefetch_bucket_size; /* elements */
        int64_t stage3_param_persistence_threshold; /* elements */
        /* ZeRO-Offload: the fp32 master weights and Adam state of each rank's shard in
         * host memory, the AdamW step on the CPU (runtime/parallel/dp.h:
         * dt_dp_opts.offload). cpu needs a sharded strategy (zero1/zero2/fsdp/hsdp);
         * on the CPU device it has no effect (a warning: the state is in host
         * memory already). */
        struct {
            dt_config_offload_t device;
            bool pin_memory; /* page-locked host buffers: copies overlap the compute */
        } offload_optimizer;
    } zero;

    /* dtrun's own keys */
    /* model.*: model.type picks model.ops (the registry, runtime/model/model.h);
     * every registered model's keys are int fields of the spec (each model owns
     * its rows, dt_model_ops.keys). vocab_size 0 = from the data (256 text, 50257
     * shards). dt_model_spec_copy() takes the chosen model's fields. */
    int model_type; /* index of model.type in the registry */
    dt_model_spec model;
    /* model.pretrained: a Hugging Face directory (runtime/model/hf_config.h). Its
     * config.json sets model.type and the model's keys (keys given beside it must
     * agree) and its safetensors the initial weights. NULL: none. */
    char *model_pretrained;
    struct {
        char *train;         /* path or glob; required for gpt (NULL when given as a list) */
        /* data.train given as a list [{"path": GLOB, "weight": W}, ...]: a weighted
         * mixture (runtime/train/data.h); NULL / 0 when data.train is a string. */
        dt_config_source *sources;
        int n_sources;
        char *val;           /* path or glob; NULL = held-out tail of train */
        double val_fraction; /* the tail's share when val is NULL */
        int64_t prefetch;    /* micro-batches read ahead on a thread; 0 = synchronous */
        bool packing;        /* masked data: documents packed into sequences (else padded) */
    } data;
    int64_t train_steps;
    int64_t seed;
    dt_config_device_t device;
    dt_strategy_t strategy;
    struct {
        char *dir;
        int64_t every_steps; /* 0 = no checkpoints */
        int64_t keep_last;   /* 0 = keep all */
        char *resume;        /* "auto" | "never" | a checkpoint path */
        bool overwrite;      /* resume never onto a dir holding checkpoints: allowed */
        bool async;          /* periodic saves written by a background thread */
    } checkpoint;
    struct {
        int64_t every_steps; /* 0 = no evaluation */
        int64_t batches;
    } eval;
    struct {
        char *dir;
        bool trace;          /* the job timeline: <dir>/trace.json (common/trace.h) */
        int64_t trace_steps; /* the timeline keeps the last N steps */
    } log;
    /* tensorboard.*: DeepSpeed's keys. Event files in <output_path or log.dir>/<job_name>/
     * (runtime/train/train_tb.c). */
    struct {
        bool enabled;
        char *output_path; /* "" = log.dir */
        char *job_name;    /* one path component */
    } tensorboard;
    struct {
        dt_comm_backend_t backend;
        double timeout_s;
    } comm;
    /* tensor_parallel.*: Megatron-style tensor parallelism. size ranks (consecutive
     * local ranks of one node) hold one model piece each; world = size x DP size.
     * DeepSpeed's tensor_parallel.autotp_size is the same key as size. */
    struct {
        int64_t size;           /* >= 1; 1 = off */
        bool sequence_parallel; /* activations between TP regions cut along the sequence */
    } tp;
    /* context_parallel.*: context parallelism (ring attention). size ranks hold 1/size
     * of every sequence each (chunks r and 2 size - 1 - r of 2 size); attention passes
     * key/value blocks around them; world = tp.size x size x stages x DP size. */
    struct {
        int64_t size; /* >= 1; 1 = off */
        int mode;     /* DT_CONFIG_CP_RING or DT_CONFIG_CP_ULYSSES */
    } cp;
    /* pipeline.*: pipeline parallelism. stages ranks (TP groups) hold consecutive blocks
     * of the model, the embedding on the first and the head on the last; micro-batches
     * per step = gradient_accumulation_steps; world = tp.size x stages x DP size. */
    struct {
        int64_t stages;         /* >= 1; 1 = off */
        dt_pp_schedule_t schedule;
        int64_t virtual_stages; /* chunks per rank (interleaved) */
        dt_pp_partition_t partition;
    } pp;
    /* activation_checkpointing.*: activation recomputation (runtime/model/model.h:
     * dt_model_recompute_t). policy and every have an effect; of DeepSpeed's keys
     * number_checkpoints sets every (ceil(layers / N)) when every is not given and the
     * others are accepted with a warning; any DeepSpeed key without a policy means
     * full (DeepSpeed checkpoints each block's input). */
    struct {
        dt_model_recompute_t policy;
        int64_t every; /* checkpoint block j of a chunk when j % every == 0 */
        int64_t number_checkpoints;
        bool partition_activations, cpu_checkpointing, contiguous_memory_optimization;
        bool synchronize_checkpoint_boundary, profile;
    } recompute;
    /* lora.*: LoRA fine-tuning of model.pretrained (runtime/model/lora.h): r > 0 turns
     * it on; the base is frozen in base_dtype, only the adapters are trained. */
    struct {
        int64_t r;            /* 0 = off */
        double alpha;         /* the adapters' output is scaled by alpha / r */
        double dropout;       /* 0 only */
        char *target_modules; /* comma-separated module names (NULL: PEFT's default) */
        int base_dtype;       /* DT_CONFIG_LORA_BASE_MAP order */
        char *init;           /* a PEFT adapter (directory or .safetensors) to start from; NULL: PEFT's init */
    } lora;
    int64_t threads; /* CPU threads per rank; 0 = auto */
    int64_t sample_tokens; /* characters rank 0 generates at the end (text data); 0 = none */

    /* bookkeeping, not keys */
    char *source;       /* the file name (or the name given to load_string) */
    int world_size;     /* of the last dt_config_resolve(); 0 before */
    int dp_size;        /* the layout's DP size (runtime/layout/layout.h), of the last dt_config_resolve(); 0 before */
    int n_errors;
    char *errors;       /* all errors, one per line ("" when none) */
    char *warnings;     /* ignored keys, "auto" values, notes ("" when none) */
    size_t errors_len, errors_cap, warnings_len, warnings_cap;
    size_t load_errors_len; /* errors text up to the end of loading */
    int load_n_errors;
    dt_config_origin_t origin[DT_CONFIG_MAX_KEYS]; /* per key row: where its value came from */
} dt_config_t;

/* Fills cfg with the defaults of every key (no file). Free with dt_config_free(). */
void dt_config_init(dt_config_t *cfg);

/* Whether dt_config_load logs the warnings (default 1). A worker the agent started
 * turns it off: the agent logged the same warnings when it checked the config. */
void dt_config_log_warnings(int on);
/* Reads and validates the JSON file at path, then applies the overrides
 * ("KEY=VALUE": value parsed as JSON, else taken as a string). cfg is always
 * initialised: call dt_config_free() on success and on failure. Returns
 * DT_STATUS_CONFIG when any error was found (dt_config_errors() lists them all;
 * dt_error_detail() holds the first ones), DT_STATUS_OK otherwise. Batch sizes
 * wait for dt_config_resolve(). Logs the warnings once (DT_LOG_WARN) unless
 * dt_config_log_warnings(0) was called. */
dt_status_t dt_config_load(const char *path, const char *const *overrides, int n_overrides,
                           dt_config_t *cfg);
/* The same from JSON text; name stands for the file in messages. */
dt_status_t dt_config_load_string(const char *json, const char *name,
                                  const char *const *overrides, int n_overrides,
                                  dt_config_t *cfg);

/* Applies one `KEY=VALUE` override on a loaded config (re-validates). */
dt_status_t dt_config_set(dt_config_t *cfg, const char *key_eq_value);
/* Sets the three batch keys (train_batch_size, train_micro_batch_size_per_gpu,
 * gradient_accumulation_steps, in that order) as given on the command line: each
 * checked against its row and named in errors as the override "KEY=VALUE" would be;
 * the first bad one stops the others. No rule across keys reads them before
 * dt_config_resolve, so, unlike dt_config_set, nothing else is checked again. The
 * elastic resize keeps a run's global batch with it (runtime/train/train_elastic.h).
 * DT_STATUS_CONFIG with the errors, as dt_config_set. */
dt_status_t dt_config_set_batch(dt_config_t *cfg, int64_t train_batch_size, int64_t micro_batch, int64_t accumulation);
/* 1 when the config file or an override gave key (not its default, null or "auto"). */
int dt_config_given(const dt_config_t *cfg, const char *key);

/* Whether this config's workers compute on a GPU and so load the CUDA library:
 * device cuda, or auto on a node whose driver has a GPU (counted without CUDA,
 * common/gpuinfo.h). The agent's check and the worker's device choice both ask. */
int dt_config_uses_cuda(const dt_config_t *cfg);

/* The compute dtype (parameters, activations and gradients), the one rule: bf16 when
 * bf16.enabled and the ranks compute on a GPU, else fp32 (the CPU device computes in
 * fp32 whatever bf16.enabled says). on_gpu is what the caller knows of the device:
 * the worker whether it opened a GPU, the checks before it whether device is not cpu,
 * the memory check whether it prices a GPU. */
dt_dtype_t dt_config_compute_dtype(const dt_config_t *cfg, int on_gpu);

/* Derives the batch sizes for world_size (DeepSpeed's rules: any two give the
 * third; train_batch_size alone gives accumulation 1; the micro-batch alone gives
 * accumulation 1; accumulation alone or nothing: micro-batch 1) and checks the
 * identity over the data-parallel size (the layout's, runtime/layout/layout.h:
 * tensor_parallel.size x pipeline.stages must divide world_size, an error otherwise). Sets cfg->world_size and cfg->dp_size. May be
 * called again with another world size (elastic restarts): only the values given
 * in the file or overrides count, never earlier derivations. */
dt_status_t dt_config_resolve(dt_config_t *cfg, int world_size);

/* The launcher's checks of the config against the node shape, before any worker
 * starts: a tensor-parallel group is tensor_parallel.size consecutive local ranks
 * of one node, so nproc_per_node must be a multiple of it. Adds to cfg's errors
 * (after dt_config_load/dt_config_resolve); DT_STATUS_CONFIG when there are any. */
dt_status_t dt_config_check_nodes(dt_config_t *cfg, int nproc_per_node);

/* tensor_parallel.size against the model with its vocabulary known (vocab_size:
 * the one the data gives when model.vocab_size is 0; 0 = still unknown, the
 * vocabulary rule is skipped as at load). 0, or 1 with msg naming the key. */
int dt_config_tp_check_vocab(const dt_config_t *cfg, int vocab_size, char *msg, size_t len);

/* All errors, one per line, "" when none. Valid until the next call on cfg. */
const char *dt_config_errors(const dt_config_t *cfg);
/* Warnings (ignored DeepSpeed keys, "auto" values, notes), one per line. */
const char *dt_config_warnings(const dt_config_t *cfg);

/* The config as JSON (every key, nested by path; batch sizes not yet derived as
 * "auto"). Loading the dump gives back the same config. free() the result. */
char *dt_config_dump_json(const dt_config_t *cfg);

/* Prints the key table: key, type, default, help (`dtrun config --keys`). */
void dt_config_print_keys(FILE *out);

void dt_config_free(dt_config_t *cfg);

/* Names of enum values as written in JSON ("fsdp", "WarmupCosineLR", ...); a
 * strategy's is the strategy table's (dt_strategy_name). */
const char *dt_config_strategy_name(dt_strategy_t s);
const char *dt_config_sched_name(dt_sched_type_t s);

/* vocab rounded up to a multiple of `multiple` (1 or less: unchanged). */
int64_t dt_config_padded_vocab(int64_t vocab, int64_t multiple);

#endif /* DT_RUNTIME_CONFIG_H */
