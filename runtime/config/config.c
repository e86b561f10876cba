/*
 * config.c - the table-driven config loader (config.h).
 *
 * One row per key (path, type, bounds, flags, default, target field, help), as
 * redis' standardConfig: the same table drives the defaults, parsing the JSON file
 * with cJSON, type and range errors, `KEY=VALUE` overrides, the JSON dump of the
 * resolved config and `dtrun config --keys`. The model.* rows come from the models
 * (runtime/model/model.h: each model's dt_model_ops.keys, model.type's names from the
 * registry); the table is assembled once, in keys_init(). Cross-key rules (strategy
 * vs ZeRO stage, the batch identity, the model's own config_check) follow the table
 * in finish() and dt_config_resolve().
 *
 * Defaults that differ from DeepSpeed's, and why:
 *   reduce_bucket_size, allgather_bucket_size: 6553600 elements (25 MiB of fp32,
 *     PyTorch DDP's bucket_cap_mb=25) instead of DeepSpeed's 5e8: with 5e8 every
 *     model dtrun trains on CPU would fit one bucket and nothing would overlap with
 *     the backward pass. Units stay DeepSpeed's (elements), so a DeepSpeed config
 *     keeps its meaning.
 *   overlap_comm: true for every stage (PyTorch DDP always overlaps); DeepSpeed
 *     turns it on by default only for stage 3.
 *   communication_data_type: fp32 (DeepSpeed: the gradient's type).
 *   batch sizes: with none given, or only gradient_accumulation_steps, the micro
 *     batch is 1 where DeepSpeed raises an error (HF-style "auto" everywhere must load).
 *   scheduler.params.warmup_max_lr: optimizer.params.lr when not given (as
 *     DeepSpeed's WarmupLR; its WarmupDecayLR would use a fixed 0.001).
 *   scheduler.params.total_num_steps: train_steps when not given.
 * Kept from DeepSpeed 0.19: gradient_clipping 1.0, warmup_num_steps 1000,
 * warmup_type log, cos_min_ratio 1e-4, stage3_prefetch_bucket_size 5e7,
 * stage3_param_persistence_threshold 1e5, contiguous_gradients, reduce_scatter and
 * allgather_partitions true.
 */
#include "runtime/config/config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h" /* defines: DT_LOG_WARN */
#include "common/mem.h" /* defines: dt_xmalloc, dt_xrealloc, dt_xstrdup */

/* ---- enum names --------------------------------------------------------- */

#define NAME_(n, s) s,
static const char *const optim_names[] = {DT_OPTIM_TYPE_MAP(NAME_) NULL};
static const char *const sched_names[] = {DT_SCHED_TYPE_MAP(NAME_) NULL};
static const char *const warmup_names[] = {DT_WARMUP_TYPE_MAP(NAME_) NULL};
static const char *const dtype_names[] = {DT_DTYPE_MAP(NAME_) NULL};
static const char *const device_names[] = {DT_DEVICE_MAP(NAME_) NULL};
static const char *const strategy_names[] = {DT_STRATEGY_MAP(NAME_) NULL};
static const char *const backend_names[] = {DT_COMM_BACKEND_MAP(NAME_) NULL};
#undef NAME_

/* Enum fields are written through an int pointer. */
_Static_assert(sizeof(dt_strategy_t) == sizeof(int), "enum fields must be int-sized");

/* ---- the table ---------------------------------------------------------- */

typedef enum key_type { KT_BOOL, KT_INT, KT_FLOAT, KT_STRING, KT_ENUM, KT_FLOAT2 } key_type_t;

static const char *const key_type_names[] = {"bool", "int", "float", "string", "enum",
                                             "[float,float]"};

enum key_flags {
    KF_DS = 1 << 0,       /* DeepSpeed's key (same name and meaning) */
    KF_MIN_EXCL = 1 << 1, /* value > min rather than >= min */
    KF_MAX_EXCL = 1 << 2, /* value < max rather than <= max */
    KF_DERIVED = 1 << 3,  /* default "auto": derived from other keys */
    KF_PATH = 1 << 4,     /* string naming a file or folder: non-empty, no "auto" */
    KF_INT32 = 1 << 5,    /* KT_INT whose field is an int (the model's keys), not int64_t */
};

typedef struct config_key {
    const char *path;
    key_type_t type;
    size_t offset;
    double min, max;
    unsigned flags;
    const char *const *names; /* KT_ENUM: allowed names, index = value */
    const char *def;          /* default as JSON text; "\"auto\"" with KF_DERIVED */
    const char *help;
} config_key_t;

#define OFF(field) offsetof(dt_config_t, field)
#define BIG 9007199254740991.0 /* 2^53 - 1: the largest exact integer in a double */
#define I32 2147483647.0

static const config_key_t head_keys[] = {
    /* DeepSpeed's keys */
    {"train_batch_size", KT_INT, OFF(train_batch_size), 1, I32, KF_DS | KF_DERIVED, NULL,
     "\"auto\"", "global batch in samples = micro * accumulation * world size"},
    {"train_micro_batch_size_per_gpu", KT_INT, OFF(train_micro_batch_size_per_gpu), 1, I32,
     KF_DS | KF_DERIVED, NULL, "\"auto\"", "samples per rank per forward/backward"},
    {"gradient_accumulation_steps", KT_INT, OFF(gradient_accumulation_steps), 1, I32,
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

    /* dtrun's own keys */
    /* model.type, then every registered model's keys: see keys_init() */
};

/* The rows after the model's. */
static const config_key_t tail_keys[] = {
    {"data.train", KT_STRING, OFF(data.train), 0, 0, KF_PATH, NULL, "null",
     "training data: a path or glob (text = bytes, or .bin token shards)"},
    {"data.val", KT_STRING, OFF(data.val), 0, 0, KF_PATH, NULL, "null",
     "validation data: a path or glob (null = tail of train)"},
    {"data.val_fraction", KT_FLOAT, OFF(data.val_fraction), 0, 1, KF_MAX_EXCL, NULL, "0.1",
     "share of train held out for validation when data.val is null"},
    {"train_steps", KT_INT, OFF(train_steps), 1, BIG, 0, NULL, "1000", "optimizer steps"},
    {"seed", KT_INT, OFF(seed), 0, BIG, 0, NULL, "1337", "seed of init and data order"},
    {"device", KT_ENUM, OFF(device), 0, 0, 0, device_names, "\"auto\"",
     "auto = cuda when a GPU is there, else cpu"},
    {"strategy", KT_ENUM, OFF(strategy), 0, 0, 0, strategy_names, "\"ddp\"",
     "data parallelism; the same thing as zero_optimization.stage"},
    {"checkpoint.dir", KT_STRING, OFF(checkpoint.dir), 0, 0, KF_PATH, NULL, "\"runs/ckpt\"",
     "checkpoint folder"},
    {"checkpoint.every_steps", KT_INT, OFF(checkpoint.every_steps), 0, BIG, 0, NULL, "0",
     "save every N steps (0 = never)"},
    {"checkpoint.keep_last", KT_INT, OFF(checkpoint.keep_last), 0, I32, 0, NULL, "3",
     "keep the newest N checkpoints (0 = all)"},
    {"checkpoint.resume", KT_STRING, OFF(checkpoint.resume), 0, 0, 0, NULL, "\"auto\"",
     "auto (latest in dir, if any) | never | a checkpoint path"},
    {"eval.every_steps", KT_INT, OFF(eval.every_steps), 0, BIG, 0, NULL, "100",
     "validation every N steps (0 = never)"},
    {"eval.batches", KT_INT, OFF(eval.batches), 1, I32, 0, NULL, "10",
     "micro-batches per evaluation"},
    {"log.dir", KT_STRING, OFF(log.dir), 0, 0, KF_PATH, NULL, "\"runs/log\"",
     "metrics.jsonl, summary.json and the resolved config"},
    {"comm.backend", KT_ENUM, OFF(comm.backend), 0, 0, 0, backend_names, "\"auto\"",
     "communicator (auto: nccl on GPUs, shm in a node, hier across nodes)"},
    {"comm.timeout_s", KT_FLOAT, OFF(comm.timeout_s), 0, 1e6, KF_MIN_EXCL, NULL, "300",
     "a collective waiting longer is a hang"},
    {"sample_tokens", KT_INT, OFF(sample_tokens), 0, 100000, 0, NULL, "0",
     "characters generated from the trained model at the end (text data only)"},
    {"threads", KT_INT, OFF(threads), 0, 4096, 0, NULL, "0",
     "CPU threads per rank (0 = cores / local ranks)"},
};

/* The table: head_keys, model.type, each model's keys (runtime/model/registry.c
 * order, a path two models share listed once), tail_keys. Built once. */
#define MAX_MODELS 32
static config_key_t keys[DT_CONFIG_MAX_KEYS];
static int n_keys;
static const char *model_names[MAX_MODELS + 1];
static char model_help[512];
#define N_KEYS n_keys

static void add_row(const config_key_t *k) {
    for (int i = 0; i < n_keys; i++)
        if (!strcmp(keys[i].path, k->path)) return;
    if (n_keys == DT_CONFIG_MAX_KEYS) abort(); /* a bug: raise DT_CONFIG_MAX_KEYS */
    keys[n_keys++] = *k;
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
            config_key_t k = {mk->path, KT_INT, OFF(model) + mk->offset, mk->min, mk->max, KF_INT32, NULL,
                              mk->def, mk->help};
            add_row(&k);
        }
    }
    for (size_t i = 0; i < sizeof tail_keys / sizeof tail_keys[0]; i++) add_row(&tail_keys[i]);
}

static pthread_once_t keys_once = PTHREAD_ONCE_INIT;
static void keys_init(void) { pthread_once(&keys_once, build_keys); }

/* DeepSpeed keys (and everything under them) that dtrun accepts and ignores. */
static const char *const ignored_keys[] = {
    "fp16", "amp", "torch_autocast", "wall_clock_breakdown", "memory_breakdown", "dump_state",
    "disable_python_gc", "log_level", "activation_checkpointing", "flops_profiler",
    "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "monitor_config",
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
    "bf16.bf16_optimizer_states", "bf16.auto_cast", "zero_optimization.offload_optimizer",
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

/* ---- growing strings ---------------------------------------------------- */

typedef struct strbuf {
    char *s;
    size_t len, cap;
} strbuf_t;

static void sb_vappend(char **s, size_t *len, size_t *cap, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) return;
    if (*len + (size_t)n + 1 > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < *len + (size_t)n + 1) nc *= 2;
        *s = dt_xrealloc(*s, nc);
        *cap = nc;
    }
    vsnprintf(*s + *len, *cap - *len, fmt, ap);
    *len += (size_t)n;
}

__attribute__((format(printf, 2, 3))) static void sb_append(strbuf_t *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sb_vappend(&b->s, &b->len, &b->cap, fmt, ap);
    va_end(ap);
}

/* "src: " + message + "\n" on the error list. */
__attribute__((format(printf, 3, 4))) static void add_error(dt_config_t *cfg, const char *src,
                                                            const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *line = NULL;
    size_t len = 0, cap = 0;
    sb_vappend(&line, &len, &cap, fmt, ap);
    va_end(ap);
    strbuf_t b = {cfg->errors, cfg->errors_len, cfg->errors_cap};
    sb_append(&b, "%s: %s\n", src, line ? line : "");
    cfg->errors = b.s;
    cfg->errors_len = b.len;
    cfg->errors_cap = b.cap;
    cfg->n_errors++;
    free(line);
}

__attribute__((format(printf, 2, 3))) static void add_warning(dt_config_t *cfg, const char *fmt,
                                                              ...) {
    va_list ap;
    va_start(ap, fmt);
    sb_vappend(&cfg->warnings, &cfg->warnings_len, &cfg->warnings_cap, fmt, ap);
    va_end(ap);
    strbuf_t b = {cfg->warnings, cfg->warnings_len, cfg->warnings_cap};
    sb_append(&b, "\n");
    cfg->warnings = b.s;
    cfg->warnings_len = b.len;
    cfg->warnings_cap = b.cap;
}

/* ---- table helpers ------------------------------------------------------ */

static int key_find(const char *path) {
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].path, path)) return i;
    return -1;
}

/* True when path is a section: a proper prefix (at a dot) of some key. */
static bool is_section(const char *path) {
    size_t n = strlen(path);
    for (int i = 0; i < N_KEYS; i++)
        if (!strncmp(keys[i].path, path, n) && keys[i].path[n] == '.') return true;
    return false;
}

static bool is_ignored(const char *path) {
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
static bool suggest(const char *path, char *out, size_t out_size) {
    int best_d = 1 << 30;
    out[0] = '\0';
    for (int i = 0; i < N_KEYS; i++) {
        const char *k = keys[i].path;
        consider(path, k, strlen(k), &best_d, out, out_size);
        for (const char *dot = strchr(k, '.'); dot; dot = strchr(dot + 1, '.'))
            consider(path, k, (size_t)(dot - k), &best_d, out, out_size);
    }
    for (int i = 0; i < N_IGNORED; i++)
        consider(path, ignored_keys[i], strlen(ignored_keys[i]), &best_d, out, out_size);
    size_t len = strlen(out);
    return best_d > 0 && (best_d <= 2 || (size_t)best_d * 3 <= len);
}

/* ---- values ------------------------------------------------------------- */

typedef struct parse_ctx {
    dt_config_t *cfg;
    const char *src;    /* for messages: the file, or "override k=v" */
    int origin;         /* 0 default, 1 file, 2 override */
    unsigned char touched[DT_CONFIG_MAX_KEYS];
    strbuf_t ignored;   /* ", "-joined ignored keys */
    strbuf_t autos;     /* ", "-joined keys given as "auto" */
} parse_ctx_t;

/* A short JSON rendering of v for "found ..." (truncated). */
static void render(const cJSON *v, char *out, size_t size) {
    if (!v) {
        snprintf(out, size, "nothing");
        return;
    }
    char *s = cJSON_PrintUnformatted(v);
    if (!s) {
        snprintf(out, size, "?");
        return;
    }
    if (strlen(s) > 60)
        snprintf(out, size, "%.57s...", s);
    else
        snprintf(out, size, "%s", s);
    cJSON_free(s);
}

/* "an integer >= 1", "a number in [0, 1)", "true or false", "one of ...". */
static void expected(const config_key_t *k, char *out, size_t size) {
    const char *what = k->type == KT_INT ? "an integer" : "a number";
    switch (k->type) {
    case KT_BOOL: snprintf(out, size, "true or false"); return;
    case KT_STRING:
        snprintf(out, size, "%s", (k->flags & KF_PATH) ? "a non-empty path string" : "a string");
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

static bool in_bounds(const config_key_t *k, double x) {
    if (!isfinite(x)) return false;
    if ((k->flags & KF_MIN_EXCL) ? !(x > k->min) : !(x >= k->min)) return false;
    if ((k->flags & KF_MAX_EXCL) ? !(x < k->max) : !(x <= k->max)) return false;
    return true;
}

static void *field(dt_config_t *cfg, const config_key_t *k) { return (char *)cfg + k->offset; }
static const void *cfield(const dt_config_t *cfg, const config_key_t *k) {
    return (const char *)cfg + k->offset;
}

static void type_error(parse_ctx_t *ctx, const config_key_t *k, const cJSON *v,
                       const char *extra) {
    char exp[256], found[80];
    expected(k, exp, sizeof exp);
    render(v, found, sizeof found);
    add_error(ctx->cfg, ctx->src, "%s: expected %s, found %s%s", k->path, exp, found,
              extra ? extra : "");
}

/* Sets key row from JSON value v; reports its own errors. */
static void set_value(parse_ctx_t *ctx, int row, const cJSON *v) {
    const config_key_t *k = &keys[row];
    dt_config_t *cfg = ctx->cfg;
    void *f = field(cfg, k);

    if (ctx->origin != 0 && ctx->touched[row]) {
        add_error(cfg, ctx->src, "%s: expected the key once, found it given twice", k->path);
        return;
    }
    ctx->touched[row] = 1;

    bool is_auto = cJSON_IsString(v) && !strcmp(v->valuestring, "auto");
    bool auto_is_name = false; /* device and comm.backend have a real "auto" */
    for (int i = 0; k->type == KT_ENUM && k->names[i]; i++)
        if (!strcmp(k->names[i], "auto")) auto_is_name = true;
    if (ctx->origin != 0 &&
        (cJSON_IsNull(v) || (is_auto && k->type != KT_STRING && !auto_is_name))) {
        /* null or "auto": not given, the default (or derived value) applies */
        if (is_auto)
            sb_append(&ctx->autos, "%s%s", ctx->autos.len ? ", " : "", k->path);
        const cJSON *d = cJSON_Parse(k->def);
        parse_ctx_t sub = {.cfg = cfg, .src = "default", .origin = 0};
        set_value(&sub, row, d);
        cJSON_Delete((cJSON *)d);
        cfg->origin[row] = 0;
        return;
    }
    if (is_auto && (k->flags & KF_PATH)) {
        type_error(ctx, k, v, " (dtrun cannot resolve \"auto\" for a path)");
        return;
    }

    switch (k->type) {
    case KT_BOOL:
        if (!cJSON_IsBool(v)) goto out_type_error;
        *(bool *)f = cJSON_IsTrue(v);
        break;
    case KT_INT: {
        if (is_auto) { /* only defaults reach here: KF_DERIVED keys start unset */
            *(int64_t *)f = 0;
            break;
        }
        if (!cJSON_IsNumber(v) || !in_bounds(k, v->valuedouble) ||
            floor(v->valuedouble) != v->valuedouble)
            goto out_type_error;
        if (k->flags & KF_INT32) *(int *)f = (int)v->valuedouble; /* bounds fit an int */
        else *(int64_t *)f = (int64_t)v->valuedouble;
        break;
    }
    case KT_FLOAT:
        if (is_auto) {
            *(double *)f = 0;
            break;
        }
        if (!cJSON_IsNumber(v) || !in_bounds(k, v->valuedouble))
            goto out_type_error;
        *(double *)f = v->valuedouble;
        break;
    case KT_FLOAT2: {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2) goto out_type_error;
        double x[2];
        for (int i = 0; i < 2; i++) {
            const cJSON *e = cJSON_GetArrayItem(v, i);
            if (!cJSON_IsNumber(e) || !in_bounds(k, e->valuedouble))
                goto out_type_error;
            x[i] = e->valuedouble;
        }
        memcpy(f, x, sizeof x);
        break;
    }
    case KT_STRING: {
        char **s = (char **)f;
        if (cJSON_IsNull(v)) { /* defaults only */
            free(*s);
            *s = NULL;
            break;
        }
        if (!cJSON_IsString(v) || ((k->flags & KF_PATH) && v->valuestring[0] == '\0'))
            goto out_type_error;
        free(*s);
        *s = dt_xstrdup(v->valuestring);
        break;
    }
    case KT_ENUM: {
        if (!cJSON_IsString(v)) goto out_type_error;
        int found = -1;
        for (int i = 0; k->names[i]; i++)
            if (!strcasecmp(k->names[i], v->valuestring)) found = i;
        if (found < 0) goto out_type_error;
        *(int *)f = found;
        break;
    }
    }
    cfg->origin[row] = (unsigned char)ctx->origin;
    return;
out_type_error:
    type_error(ctx, k, v, NULL);
}

static void apply_path(parse_ctx_t *ctx, const char *path, const cJSON *v);

static void walk(parse_ctx_t *ctx, const cJSON *obj, const char *prefix) {
    for (const cJSON *m = obj->child; m; m = m->next) {
        const char *name = m->string ? m->string : "";
        size_t n = strlen(prefix) + strlen(name) + 2;
        char *path = dt_xmalloc(n);
        snprintf(path, n, "%s%s%s", prefix, prefix[0] ? "." : "", name);
        apply_path(ctx, path, m);
        free(path);
    }
}

static void apply_path(parse_ctx_t *ctx, const char *path, const cJSON *v) {
    int row = key_find(path);
    if (row >= 0) {
        set_value(ctx, row, v);
        return;
    }
    if (is_section(path)) {
        if (cJSON_IsObject(v))
            walk(ctx, v, path);
        else if (!cJSON_IsNull(v)) {
            char found[80];
            render(v, found, sizeof found);
            add_error(ctx->cfg, ctx->src, "%s: expected an object, found %s", path, found);
        }
        return;
    }
    if (is_ignored(path)) {
        sb_append(&ctx->ignored, "%s%s", ctx->ignored.len ? ", " : "", path);
        return;
    }
    char best[256];
    if (suggest(path, best, sizeof best))
        add_error(ctx->cfg, ctx->src, "%s: unknown key (did you mean %s?)", path, best);
    else
        add_error(ctx->cfg, ctx->src, "%s: unknown key (dtrun config --keys lists them)", path);
}

/* ---- life cycle --------------------------------------------------------- */

static void derive(dt_config_t *cfg);

/* model.ops from model.type. */
static void sync_model(dt_config_t *cfg) { cfg->model.ops = dt_model_at(cfg->model_type); }

void dt_config_init(dt_config_t *cfg) {
    keys_init();
    memset(cfg, 0, sizeof *cfg);
    parse_ctx_t ctx = {.cfg = cfg, .src = "default", .origin = 0};
    for (int i = 0; i < N_KEYS; i++) {
        cJSON *d = cJSON_Parse(keys[i].def);
        set_value(&ctx, i, d); /* a bad default is a bug: test_config checks none fail */
        cJSON_Delete(d);
    }
    derive(cfg);
    sync_model(cfg);
    cfg->errors = dt_xstrdup("");
    cfg->errors_cap = 1;
    cfg->warnings = dt_xstrdup("");
    cfg->warnings_cap = 1;
}

void dt_config_free(dt_config_t *cfg) {
    if (!cfg) return;
    for (int i = 0; i < N_KEYS; i++)
        if (keys[i].type == KT_STRING) free(*(char **)field(cfg, &keys[i]));
    free(cfg->source);
    free(cfg->errors);
    free(cfg->warnings);
    memset(cfg, 0, sizeof *cfg);
}

const char *dt_config_errors(const dt_config_t *cfg) { return cfg->errors ? cfg->errors : ""; }
const char *dt_config_warnings(const dt_config_t *cfg) {
    return cfg->warnings ? cfg->warnings : "";
}

int dt_config_strategy_stage(dt_strategy_t s) {
    switch (s) {
    case DT_STRATEGY_DDP: return 0;
    case DT_STRATEGY_ZERO1: return 1;
    case DT_STRATEGY_ZERO2: return 2;
    default: return 3;
    }
}

static dt_strategy_t strategy_for_stage(int64_t stage, dt_strategy_t current) {
    if (dt_config_strategy_stage(current) == stage) return current;
    static const dt_strategy_t by_stage[] = {DT_STRATEGY_DDP, DT_STRATEGY_ZERO1,
                                             DT_STRATEGY_ZERO2, DT_STRATEGY_FSDP};
    return by_stage[stage < 0 ? 0 : stage > 3 ? 3 : stage];
}

const char *dt_config_strategy_name(dt_strategy_t s) {
    return (unsigned)s < sizeof strategy_names / sizeof *strategy_names - 1 ? strategy_names[s]
                                                                             : "?";
}
const char *dt_config_sched_name(dt_sched_type_t s) {
    return (unsigned)s < sizeof sched_names / sizeof *sched_names - 1 ? sched_names[s] : "?";
}

int64_t dt_config_padded_vocab(int64_t vocab, int64_t multiple) {
    if (multiple <= 1) return vocab;
    return (vocab + multiple - 1) / multiple * multiple;
}

/* Keeps strategy and zero_optimization.stage the same thing after an override
 * touched one of them (the override sets both). */
static void sync_strategy_override(parse_ctx_t *ctx) {
    dt_config_t *cfg = ctx->cfg;
    int rs = key_find("strategy"), rz = key_find("zero_optimization.stage");
    if (ctx->touched[rs] && ctx->touched[rz]) {
        if (dt_config_strategy_stage(cfg->strategy) != cfg->zero.stage)
            add_error(cfg, ctx->src,
                      "strategy \"%s\" and zero_optimization.stage %lld: expected the same "
                      "thing (%s is stage %d)",
                      dt_config_strategy_name(cfg->strategy), (long long)cfg->zero.stage,
                      dt_config_strategy_name(cfg->strategy),
                      dt_config_strategy_stage(cfg->strategy));
    } else if (ctx->touched[rs] && cfg->origin[rs] == 2) {
        cfg->zero.stage = dt_config_strategy_stage(cfg->strategy);
        cfg->origin[rz] = 2;
    } else if (ctx->touched[rz] && cfg->origin[rz] == 2) {
        cfg->strategy = strategy_for_stage(cfg->zero.stage, cfg->strategy);
        cfg->origin[rs] = 2;
    }
}

/* Values that default to other keys' values. */
static void derive(dt_config_t *cfg) {
    if (!cfg->origin[key_find("scheduler.params.warmup_max_lr")])
        cfg->scheduler.warmup_max_lr = cfg->optimizer.lr;
    if (!cfg->origin[key_find("scheduler.params.total_num_steps")])
        cfg->scheduler.total_num_steps = cfg->train_steps;
}

/* Rules across keys, once the file and the overrides are in. */
static void finish(dt_config_t *cfg, const char *src) {
    int rs = key_find("strategy"), rz = key_find("zero_optimization.stage");
    if (cfg->origin[rs] == 1 && cfg->origin[rz] == 1) {
        if (dt_config_strategy_stage(cfg->strategy) != cfg->zero.stage)
            add_error(cfg, src,
                      "strategy \"%s\" and zero_optimization.stage %lld: expected the same "
                      "thing (%s is stage %d); give one, or override either on the command "
                      "line",
                      dt_config_strategy_name(cfg->strategy), (long long)cfg->zero.stage,
                      dt_config_strategy_name(cfg->strategy),
                      dt_config_strategy_stage(cfg->strategy));
    } else if (cfg->origin[rs] == 1) {
        cfg->zero.stage = dt_config_strategy_stage(cfg->strategy);
    } else if (cfg->origin[rz] == 1) {
        cfg->strategy = strategy_for_stage(cfg->zero.stage, cfg->strategy);
    }

    derive(cfg);
    if ((cfg->scheduler.type == DT_SCHED_WARMUP_DECAY_LR ||
         cfg->scheduler.type == DT_SCHED_WARMUP_COSINE_LR) &&
        cfg->scheduler.total_num_steps < cfg->scheduler.warmup_num_steps)
        add_warning(cfg,
                    "%s: scheduler.params.total_num_steps %lld is less than warmup_num_steps "
                    "%lld: the decay never starts",
                    src, (long long)cfg->scheduler.total_num_steps,
                    (long long)cfg->scheduler.warmup_num_steps);

    sync_model(cfg);
    char msg[512];
    if (cfg->model.ops->config_check && cfg->model.ops->config_check(&cfg->model, msg, sizeof msg))
        add_error(cfg, src, "%s", msg);
    if (cfg->model.ops->data == DT_MODEL_DATA_TOKENS) {
        if (!cfg->data.train)
            add_error(cfg, src,
                      "data.train: expected a path or glob of training data (model.type %s "
                      "reads text or token shards), found nothing",
                      cfg->model.ops->name);
        if (cfg->eval.every_steps > 0 && !cfg->data.val && cfg->data.val_fraction <= 0)
            add_error(cfg, src,
                      "data.val_fraction: expected a number in (0, 1) when data.val is not "
                      "given and eval.every_steps is %lld (evaluation needs held-out data), "
                      "found 0",
                      (long long)cfg->eval.every_steps);
    }
}

static char *read_file(const char *path, size_t *len, int *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *err = errno;
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = dt_xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) {
            if (cap >= (64u << 20)) { /* a config is small; refuse to swallow a disk image */
                free(buf);
                fclose(f);
                *err = EFBIG;
                return NULL;
            }
            cap *= 2;
            buf = dt_xrealloc(buf, cap);
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) {
        *err = errno ? errno : EIO;
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

static void flush_notes(parse_ctx_t *ctx) {
    if (ctx->ignored.len)
        add_warning(ctx->cfg, "%s: ignoring DeepSpeed keys that dtrun does not implement: %s",
                    ctx->src, ctx->ignored.s);
    if (ctx->autos.len)
        add_warning(ctx->cfg, "%s: \"auto\" resolved to dtrun's default or derived value for: %s",
                    ctx->src, ctx->autos.s);
    free(ctx->ignored.s);
    free(ctx->autos.s);
    ctx->ignored = (strbuf_t){0};
    ctx->autos = (strbuf_t){0};
}

/* Applies one "KEY=VALUE"; errors are recorded on cfg. */
static void apply_override(dt_config_t *cfg, const char *kv) {
    size_t n = strlen("override ") + strlen(kv) + 1;
    char *src = dt_xmalloc(n);
    snprintf(src, n, "override %s", kv);
    parse_ctx_t ctx = {.cfg = cfg, .src = src, .origin = 2};
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) {
        add_error(cfg, src, "expected KEY=VALUE (e.g. optimizer.params.lr=3e-4), found no %s",
                  eq ? "key" : "'='");
        free(src);
        return;
    }
    char *key = dt_xmalloc((size_t)(eq - kv) + 1);
    memcpy(key, kv, (size_t)(eq - kv));
    key[eq - kv] = '\0';
    const char *text = eq + 1;
    int row = key_find(key);
    cJSON *v = cJSON_ParseWithOpts(text, NULL, 1);
    /* a string or enum key takes the text as it is, unless it is a quoted JSON string
     * (or null); other keys take it as a string when it is not JSON */
    bool raw = !v || (row >= 0 && (keys[row].type == KT_STRING || keys[row].type == KT_ENUM) &&
                      !cJSON_IsString(v) && !cJSON_IsNull(v));
    if (raw) {
        cJSON_Delete(v);
        v = cJSON_CreateString(text);
    }
    apply_path(&ctx, key, v);
    sync_strategy_override(&ctx);
    flush_notes(&ctx);
    cJSON_Delete(v);
    free(key);
    free(src);
}

/* Where cJSON stopped, as line and column, with the text there. */
static void json_error(dt_config_t *cfg, const char *name, const char *json, const char *end) {
    const char *blank = " \t\r\n";
    size_t len = strlen(json);
    if (strspn(json, blank) == len) {
        add_error(cfg, name, "expected a JSON object, found an empty file");
        return;
    }
    const char *stop = end && end >= json && end <= json + len ? end : json + len;
    bool at_end = stop[strspn(stop, blank)] == '\0';
    /* cJSON may stop on blanks after the offending token: step back to it */
    while (stop > json && (*stop == '\0' || strchr(blank, *stop))) stop--;
    int line = 1, col = 1;
    for (const char *p = json; p < stop; p++) {
        if (*p == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    char near[32];
    size_t k = 0;
    if (at_end) { /* the text ran out: show what came last */
        const char *from = stop;
        while (from > json && from[-1] != '\n' && stop - from < 23) from--;
        for (const char *p = from; p <= stop && k < sizeof near - 1; p++) near[k++] = *p;
        near[k] = '\0';
        add_error(cfg, name,
                  "line %d, column %d: expected valid JSON, found the end of the file after \"%s\"",
                  line, col, near);
        return;
    }
    for (const char *p = stop; *p && *p != '\n' && k < 24; p++) near[k++] = *p;
    near[k] = '\0';
    add_error(cfg, name, "line %d, column %d: expected valid JSON, found \"%s\"", line, col, near);
}

static void set_first_error_detail(const dt_config_t *cfg) {
    dt_error(DT_STATUS_CONFIG, "%d config error%s:\n%s", cfg->n_errors,
             cfg->n_errors == 1 ? "" : "s", cfg->errors);
}

static dt_status_t load_text(const char *json, const char *name, const char *const *overrides,
                             int n_overrides, dt_config_t *cfg) {
    parse_ctx_t ctx = {.cfg = cfg, .src = name, .origin = 1};
    if (json) {
        const char *end = NULL;
        cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
        if (!root) {
            json_error(cfg, name, json, end);
        } else if (!cJSON_IsObject(root)) {
            char found[80];
            render(root, found, sizeof found);
            add_error(cfg, name, "expected a JSON object at the top, found %s", found);
        } else {
            walk(&ctx, root, "");
            bool has_model = false;
            for (int i = 0; i < N_KEYS; i++)
                if (!strncmp(keys[i].path, "model.", 6) && cfg->origin[i]) has_model = true;
            bool model_override = false;
            for (int i = 0; i < n_overrides; i++)
                if (overrides[i] && !strncmp(overrides[i], "model.", 6)) model_override = true;
            if (!has_model && !model_override)
                add_warning(cfg, "%s: no \"model\" section: training model.type mlp on "
                                 "synthetic data",
                            name);
        }
        cJSON_Delete(root);
        flush_notes(&ctx);
    }
    for (int i = 0; i < n_overrides; i++) {
        if (!overrides[i]) continue;
        apply_override(cfg, overrides[i]);
    }
    finish(cfg, name);
    cfg->load_errors_len = cfg->errors_len;
    cfg->load_n_errors = cfg->n_errors;
    if (cfg->warnings_len) {
        /* the warnings once, line by line */
        char *copy = dt_xstrdup(cfg->warnings);
        for (char *save = NULL, *l = strtok_r(copy, "\n", &save); l;
             l = strtok_r(NULL, "\n", &save))
            DT_LOG_WARN("%s", l);
        free(copy);
    }
    if (cfg->n_errors) {
        set_first_error_detail(cfg);
        return DT_STATUS_CONFIG;
    }
    return DT_STATUS_OK;
}

dt_status_t dt_config_load_string(const char *json, const char *name,
                                  const char *const *overrides, int n_overrides,
                                  dt_config_t *cfg) {
    dt_config_init(cfg);
    cfg->source = dt_xstrdup(name ? name : "config");
    return load_text(json ? json : "", cfg->source, overrides, n_overrides, cfg);
}

dt_status_t dt_config_load(const char *path, const char *const *overrides, int n_overrides,
                           dt_config_t *cfg) {
    dt_config_init(cfg);
    cfg->source = dt_xstrdup(path ? path : "(no file)");
    if (!path) return load_text(NULL, cfg->source, overrides, n_overrides, cfg);
    size_t len = 0;
    int err = 0;
    char *text = read_file(path, &len, &err);
    if (!text) {
        add_error(cfg, path, "expected a readable JSON file, found an error: %s",
                  err == EFBIG ? "a file over 64 MiB" : strerror(err));
        cfg->load_errors_len = cfg->errors_len;
        cfg->load_n_errors = cfg->n_errors;
        set_first_error_detail(cfg);
        return DT_STATUS_CONFIG;
    }
    if (strlen(text) != len) {
        add_error(cfg, path, "expected a JSON text file, found a NUL byte at offset %zu",
                  strlen(text));
        free(text);
        cfg->load_errors_len = cfg->errors_len;
        cfg->load_n_errors = cfg->n_errors;
        set_first_error_detail(cfg);
        return DT_STATUS_CONFIG;
    }
    dt_status_t st = load_text(text, cfg->source, overrides, n_overrides, cfg);
    free(text);
    return st;
}

dt_status_t dt_config_set(dt_config_t *cfg, const char *key_eq_value) {
    cfg->errors_len = cfg->load_errors_len;
    cfg->n_errors = cfg->load_n_errors;
    if (cfg->errors) cfg->errors[cfg->errors_len] = '\0';
    apply_override(cfg, key_eq_value ? key_eq_value : "");
    finish(cfg, cfg->source ? cfg->source : "config");
    cfg->load_errors_len = cfg->errors_len;
    cfg->load_n_errors = cfg->n_errors;
    if (cfg->n_errors) {
        set_first_error_detail(cfg);
        return DT_STATUS_CONFIG;
    }
    return DT_STATUS_OK;
}

/* ---- the batch identity ------------------------------------------------- */

dt_status_t dt_config_resolve(dt_config_t *cfg, int world_size) {
    /* forget the errors of an earlier resolve */
    cfg->errors_len = cfg->load_errors_len;
    cfg->n_errors = cfg->load_n_errors;
    if (cfg->errors) cfg->errors[cfg->errors_len] = '\0';
    const char *src = cfg->source ? cfg->source : "config";

    if (world_size < 1) {
        add_error(cfg, src, "world size: expected an integer >= 1, found %d", world_size);
        set_first_error_detail(cfg);
        return DT_STATUS_CONFIG;
    }
    cfg->world_size = world_size;
    bool g_tb = cfg->origin[key_find("train_batch_size")] != 0;
    bool g_mb = cfg->origin[key_find("train_micro_batch_size_per_gpu")] != 0;
    bool g_ga = cfg->origin[key_find("gradient_accumulation_steps")] != 0;
    int64_t tb = g_tb ? cfg->train_batch_size : 0;
    int64_t mb = g_mb ? cfg->train_micro_batch_size_per_gpu : 0;
    int64_t ga = g_ga ? cfg->gradient_accumulation_steps : 0;
    int64_t ws = world_size;
    const char *why = NULL;
    char whybuf[200];

    if (g_tb && g_mb && g_ga) {
        if (tb != mb * ga * ws) {
            snprintf(whybuf, sizeof whybuf, "%lld * %lld * %lld = %lld, not %lld",
                     (long long)mb, (long long)ga, (long long)ws, (long long)(mb * ga * ws),
                     (long long)tb);
            why = whybuf;
        }
    } else if (g_tb && g_mb) {
        if (tb % (mb * ws) != 0) {
            snprintf(whybuf, sizeof whybuf,
                     "%lld is not a multiple of %lld * %lld, so gradient_accumulation_steps "
                     "cannot be derived",
                     (long long)tb, (long long)mb, (long long)ws);
            why = whybuf;
        } else {
            ga = tb / (mb * ws);
        }
    } else if (g_tb && g_ga) {
        if (tb % (ga * ws) != 0) {
            snprintf(whybuf, sizeof whybuf,
                     "%lld is not a multiple of %lld * %lld, so train_micro_batch_size_per_gpu "
                     "cannot be derived",
                     (long long)tb, (long long)ga, (long long)ws);
            why = whybuf;
        } else {
            mb = tb / (ga * ws);
        }
    } else if (g_mb && g_ga) {
        tb = mb * ga * ws;
    } else if (g_tb) {
        ga = 1;
        if (tb % ws != 0) {
            snprintf(whybuf, sizeof whybuf,
                     "%lld is not a multiple of the world size, so "
                     "train_micro_batch_size_per_gpu cannot be derived",
                     (long long)tb);
            why = whybuf;
        } else {
            mb = tb / ws;
        }
    } else if (g_mb) {
        ga = 1;
        tb = mb * ws;
    } else {
        mb = 1;
        ga = g_ga ? ga : 1;
        tb = mb * ga * ws;
    }
    if (why) {
        char a[32], b[32], c[32];
        snprintf(a, sizeof a, g_tb ? "%lld" : "(not given)", (long long)tb);
        snprintf(b, sizeof b, g_mb ? "%lld" : "(not given)", (long long)mb);
        snprintf(c, sizeof c, g_ga ? "%lld" : "(not given)", (long long)ga);
        add_error(cfg, src,
                  "train_batch_size %s, train_micro_batch_size_per_gpu %s, "
                  "gradient_accumulation_steps %s, world size %d: expected train_batch_size = "
                  "train_micro_batch_size_per_gpu * gradient_accumulation_steps * world size, "
                  "found %s",
                  a, b, c, world_size, why);
        set_first_error_detail(cfg);
        return DT_STATUS_CONFIG;
    }
    cfg->train_batch_size = tb;
    cfg->train_micro_batch_size_per_gpu = mb;
    cfg->gradient_accumulation_steps = ga;
    if (cfg->n_errors) {
        set_first_error_detail(cfg);
        return DT_STATUS_CONFIG;
    }
    return DT_STATUS_OK;
}

/* ---- dump and listing --------------------------------------------------- */

static cJSON *value_json(const dt_config_t *cfg, int row) {
    const config_key_t *k = &keys[row];
    const void *f = cfield(cfg, k);
    switch (k->type) {
    case KT_BOOL: return cJSON_CreateBool(*(const bool *)f);
    case KT_INT: {
        int64_t x = (k->flags & KF_INT32) ? *(const int *)f : *(const int64_t *)f;
        if ((k->flags & KF_DERIVED) && x == 0 && cfg->origin[row] == 0)
            return cJSON_CreateString("auto");
        return cJSON_CreateNumber((double)x);
    }
    case KT_FLOAT: {
        double x = *(const double *)f;
        if ((k->flags & KF_DERIVED) && x == 0 && cfg->origin[row] == 0)
            return cJSON_CreateString("auto");
        return cJSON_CreateNumber(x);
    }
    case KT_FLOAT2: return cJSON_CreateDoubleArray((const double *)f, 2);
    case KT_STRING: {
        const char *s = *(char *const *)f;
        return s ? cJSON_CreateString(s) : cJSON_CreateNull();
    }
    case KT_ENUM: return cJSON_CreateString(k->names[*(const int *)f]);
    }
    return cJSON_CreateNull();
}

char *dt_config_dump_json(const dt_config_t *cfg) {
    keys_init();
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    for (int i = 0; i < N_KEYS; i++) {
        /* walk or create the sections of the path */
        cJSON *obj = root;
        const char *p = keys[i].path;
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
    keys_init();
    fprintf(out, "%-52s %-14s %-14s %s\n", "KEY", "TYPE", "DEFAULT", "HELP");
    for (int i = 0; i < N_KEYS; i++) {
        const config_key_t *k = &keys[i];
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
