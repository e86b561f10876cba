/*
 * cmd_plan.c - dtrun plan [CONFIG.json [KEY=VALUE ...]] [PLAN FLAGS]: per-GPU
 * memory, step time, scaling efficiency, time and cost of each strategy at each
 * GPU count, and a recommendation (the arithmetic is runtime/tools/plan.c). --measure
 * runs the config for a few steps and prints the measurement beside the estimate.
 *
 * --json keys (stable; bytes, seconds, FLOP/s; null where unknown):
 *   model {source, type, params, params_unpadded, flops_per_token, micro_batch, accum,
 *          seq_len, precision, strategy (with a config)}
 *   gpu {name, mem_bytes, mem_shared, peak_flops, mfu, reserve}
 *   links {intra {name, bytes_per_s, alpha_s}, inter {...}, gpus_per_node}
 *   work {hours_1gpu, tokens, price}
 *   rows [{strategy, gpus, nodes, shard, tp, dp, micro_batch, accum,
 *          memory_bytes {params, grads, optim, model_states, activations,
 *                        activations_ckpt, comm_buffers, total, total_ckpt, usable},
 *          fits ("yes" | "ckpt" | "no"),
 *          step_s {compute, comm, overlapped, exposed, tp_comm, total} (comm and
 *          exposed include tp_comm), collectives, efficiency, tokens_per_s, hours, cost}]
 *   recommendation {cheapest {strategy, gpus, tp, row, reason}, fastest {...},
 *                   tp (why the TP size; "" when every row is TP 1)}
 *   model also has tp_sizes [..] and sequence_parallel
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "common/fs.h"
#include "common/gpuinfo.h" /* defines: dt_gpu_spec_* */
#include "common/mem.h"
#include "kernels/kernels.h"
#include "runtime/config/config.h"
#include "runtime/train/metrics.h"
#include "runtime/model/model.h"
#include "runtime/layout/layout.h"   /* defines: dt_layout_of */
#include "runtime/layout/pp_sched.h" /* defines: dt_pp_schedule_check */
#include "runtime/tools/plan.h"
#include "cli/cmd_plan.h"



/* The CPU's peak with `threads` threads, from the CPU device's own probe. */
static double cpu_peak_flops(int threads) {
    dt_device_t *dev;
    if (dt_device_init(&dev, DT_DEVICE_CPU, threads) != DT_STATUS_OK) return 0;
    double p = dev->ops->peak_flops(dev);
    dt_device_free(dev);
    return p;
}

#define usage_error cmd_plan_usage_error
int cmd_plan_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("dtrun plan: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n(dtrun plan --help for the flags)\n", stderr);
    va_end(ap);
    return DT_EXIT_USAGE;
}

/* "7e9", "7B", "124M", "1.5T": decimal suffixes k/K, M, B/G, T. */
static int parse_count(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v)) return -1;
    switch (*end) {
    case 'k': case 'K': v *= 1e3; end++; break;
    case 'M': v *= 1e6; end++; break;
    case 'B': case 'G': v *= 1e9; end++; break;
    case 'T': v *= 1e12; end++; break;
    default: break;
    }
    if (*end) return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

static int parse_int(const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < -1000000000L || v > 1000000000L) return -1;
    *out = (int)v;
    return 0;
}


/* Flags that take a value; a flag in both spellings ('_' or '-') is accepted. */
static const char *const value_flags[] = {
    "--params", "--layers", "--hidden", "--heads", "--seq", "--vocab", "--micro-batch",
    "--accum", "--gpus", "--gpu", "--gpu-mem", "--gpu-tflops", "--mfu", "--reserve",
    "--nodes", "--gpus-per-node", "--link", "--link-gbps", "--intra-link",
    "--intra-link-gbps", "--tokens", "--hours-1gpu", "--price", "--strategy",
    "--precision", "--comm-dtype", "--measure-steps", "--tp", "--pp", "--schedule", "--virtual-stages",
    "--partition", "--kv-heads", "--ffn", "--lora-r", "--base-dtype", "--lora-targets", NULL};

/* --tp 1,2,4,8 or --tp auto */
static int parse_list_tp(const char *s, plan_opts *o) {
    o->n_tps = 0;
    o->tp_auto = !strcasecmp(s, "auto");
    if (o->tp_auto) return 0;
    char buf[256];
    if (strlen(s) >= sizeof buf) return usage_error("--tp: the list is too long");
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int v;
        if (parse_int(t, &v) || v < 1 || v > 4096)
            return usage_error("--tp: expected TP sizes >= 1 like 1,2,4,8 (or auto), found \"%s\"", s);
        if (o->n_tps == MAX_TP_SIZES) return usage_error("--tp: at most %d sizes", MAX_TP_SIZES);
        o->tps[o->n_tps++] = v;
    }
    if (!o->n_tps) return usage_error("--tp: expected a list of TP sizes like 1,2,4,8 (or auto)");
    return 0;
}

static int parse_list_counts(const char *s, plan_opts *o) {
    char buf[512];
    if (strlen(s) >= sizeof buf) return usage_error("--gpus: the list is too long");
    snprintf(buf, sizeof buf, "%s", s);
    o->n_counts = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int v;
        if (parse_int(t, &v) || v < 1 || v > PLAN_MAX_GPUS)
            return usage_error("--gpus: expected a list of GPU counts >= 1 like 1,2,4,8, found "
                               "\"%s\"",
                               s);
        if (o->n_counts == MAX_GPU_COUNTS)
            return usage_error("--gpus: at most %d counts", MAX_GPU_COUNTS);
        o->counts[o->n_counts++] = v;
    }
    if (!o->n_counts) return usage_error("--gpus: expected a list of GPU counts like 1,2,4,8");
    return 0;
}

static int parse_list_strategies(const char *s, plan_opts *o) {
    char buf[256];
    if (strlen(s) >= sizeof buf) return usage_error("--strategy: the list is too long");
    snprintf(buf, sizeof buf, "%s", s);
    o->n_strategies = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int v = dt_strategy_parse(t);
        if (v < 0)
            return usage_error("--strategy: unknown strategy \"%s\" (known: ddp, zero1, zero2, "
                               "fsdp, hybrid)",
                               t);
        if (o->n_strategies < DT_STRATEGY_COUNT) o->strategies[o->n_strategies++] = v;
    }
    if (!o->n_strategies) return usage_error("--strategy: expected a list like ddp,fsdp");
    return 0;
}

/* Returns 0, or an exit code. */
static int parse_args(int argc, char **argv, plan_opts *o) {
    memset(o, 0, sizeof *o);
    o->gpu_mem = o->gpu_tflops = o->link_gbps = o->intra_gbps = o->mfu = o->reserve = -1;
    o->tokens = o->hours = o->price = -1;
    o->measure_steps = 5;
    o->highlight_strategy = -1;
    o->schedule = o->partition = -1;
    for (int i = 1; i < argc; i++) {
        char flag[64];
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return -1;
        if (a[0] != '-' || a[1] != '-') {
            if (strchr(a, '=') && o->config) {
                if (o->n_overrides == MAX_OVERRIDES)
                    return usage_error("too many KEY=VALUE overrides (at most %d)", MAX_OVERRIDES);
                o->overrides[o->n_overrides++] = a;
            } else if (!o->config && !strchr(a, '=')) {
                o->config = a;
            } else {
                return usage_error("unexpected argument \"%s\" (one CONFIG.json, then KEY=VALUE "
                                   "overrides)",
                                   a);
            }
            continue;
        }
        snprintf(flag, sizeof flag, "%s", a);
        char *eq = strchr(flag, '=');
        const char *val = NULL;
        if (eq) {
            *eq = '\0';
            val = a + (eq - flag) + 1;
        }
        for (char *p = flag + 2; *p; p++)
            if (*p == '_') *p = '-';
        if (!strcmp(flag, "--json") || !strcmp(flag, "--measure") || !strcmp(flag, "--sp") ||
            !strcmp(flag, "--sequence-parallel")) {
            if (val) return usage_error("%s takes no value", flag);
            if (flag[2] == 'j') o->json = 1;
            else if (flag[2] == 'm') o->measure = 1;
            else o->sp = 1;
            continue;
        }
        int known = 0;
        for (int k = 0; value_flags[k]; k++) known |= !strcmp(flag, value_flags[k]);
        if (!known) return usage_error("unknown flag %s", a);
        if (!val) {
            if (i + 1 >= argc) return usage_error("%s: expected a value", flag);
            val = argv[++i];
        }
        int bad = 0;
        double d;
        int lora_rc = cmd_plan_parse_lora_flag(flag, val, o);
        if (lora_rc != 1) {
            if (lora_rc) return lora_rc;
            continue;
        }
        int pp_rc = cmd_plan_parse_pp_flag(flag, val, o);
        if (pp_rc != 1) {
            if (pp_rc) return pp_rc;
            continue;
        }
        if (!strcmp(flag, "--params")) {
            if (parse_count(val, &o->params) || o->params < 1)
                return usage_error("--params: expected a parameter count like 7e9 or 124M, "
                                   "found \"%s\"",
                                   val);
        } else if (!strcmp(flag, "--layers")) bad = parse_int(val, &o->layers) || o->layers < 1;
        else if (!strcmp(flag, "--hidden")) bad = parse_int(val, &o->hidden) || o->hidden < 1;
        else if (!strcmp(flag, "--heads")) bad = parse_int(val, &o->heads) || o->heads < 1;
        else if (!strcmp(flag, "--kv-heads")) bad = parse_int(val, &o->kv_heads) || o->kv_heads < 1;
        else if (!strcmp(flag, "--ffn")) bad = parse_int(val, &o->ffn) || o->ffn < 1;
        else if (!strcmp(flag, "--seq")) bad = parse_int(val, &o->seq) || o->seq < 1;
        else if (!strcmp(flag, "--vocab")) bad = parse_int(val, &o->vocab) || o->vocab < 1;
        else if (!strcmp(flag, "--micro-batch"))
            bad = parse_int(val, &o->micro_batch) || o->micro_batch < 1;
        else if (!strcmp(flag, "--accum")) bad = parse_int(val, &o->accum) || o->accum < 1;
        else if (!strcmp(flag, "--measure-steps"))
            bad = parse_int(val, &o->measure_steps) || o->measure_steps < 1;
        else if (!strcmp(flag, "--gpus-per-node"))
            bad = parse_int(val, &o->gpus_per_node) || o->gpus_per_node < 1 || o->gpus_per_node > PLAN_MAX_GPUS;
        else if (!strcmp(flag, "--gpus")) {
            int rc = parse_list_counts(val, o);
            if (rc) return rc;
        } else if (!strcmp(flag, "--strategy")) {
            int rc = parse_list_strategies(val, o);
            if (rc) return rc;
        } else if (!strcmp(flag, "--tp")) {
            int rc = parse_list_tp(val, o);
            if (rc) return rc;
        } else if (!strcmp(flag, "--nodes")) {
            char tail;
            long m = 0, g = 0;
            if (sscanf(val, "%ldx%ld%c", &m, &g, &tail) != 2 || m < 1 || g < 1 || m > PLAN_MAX_GPUS ||
                g > PLAN_MAX_GPUS || m * g > PLAN_MAX_GPUS)
                return usage_error("--nodes: expected MxG (M nodes of G GPUs, e.g. 2x8, at most %d GPUs "
                                   "in all), found \"%s\"",
                                   PLAN_MAX_GPUS, val);
            o->nodes_m = (int)m, o->nodes_g = (int)g;
        } else if (!strcmp(flag, "--gpu")) o->gpu = val;
        else if (!strcmp(flag, "--link")) o->link = val;
        else if (!strcmp(flag, "--intra-link")) o->intra_link = val;
        else if (!strcmp(flag, "--precision")) o->precision = val;
        else if (!strcmp(flag, "--comm-dtype")) o->comm_dtype = val;
        else if (!strcmp(flag, "--tokens")) {
            if (parse_count(val, &o->tokens) || o->tokens <= 0)
                return usage_error("--tokens: expected a token count > 0 like 1e10 or 10B, "
                                   "found \"%s\"",
                                   val);
        } else {
            if (parse_double(val, &d))
                return usage_error("%s: expected a number, found \"%s\"", flag, val);
            if (!strcmp(flag, "--gpu-mem")) bad = !((o->gpu_mem = d) > 0);
            else if (!strcmp(flag, "--gpu-tflops")) bad = !((o->gpu_tflops = d) > 0);
            else if (!strcmp(flag, "--link-gbps")) bad = !((o->link_gbps = d) > 0);
            else if (!strcmp(flag, "--intra-link-gbps")) bad = !((o->intra_gbps = d) > 0);
            else if (!strcmp(flag, "--hours-1gpu")) bad = !((o->hours = d) > 0);
            else if (!strcmp(flag, "--price")) bad = !((o->price = d) >= 0);
            else if (!strcmp(flag, "--mfu")) {
                o->mfu = d;
                if (!(d > 0 && d <= 1))
                    return usage_error("--mfu: expected a fraction 0 < F <= 1, found %s", val);
            } else if (!strcmp(flag, "--reserve")) {
                o->reserve = d;
                if (!(d >= 0 && d < 1))
                    return usage_error("--reserve: expected a fraction 0 <= F < 1, found %s", val);
            }
        }
        if (bad) return usage_error("%s: expected a positive number, found \"%s\"", flag, val);
    }
    /* contradictions */
    int sizes = o->layers || o->hidden || o->seq || o->heads || o->vocab || o->kv_heads || o->ffn;
    if (o->config && (o->params > 0 || sizes))
        return usage_error("--params/--layers/--hidden/--seq/--heads/--kv-heads/--ffn/--vocab describe a model; "
                           "the config %s already defines one (use KEY=VALUE overrides)",
                           o->config);
    if (o->config && (o->micro_batch || o->accum))
        return usage_error("%s: the config sets the batch; override it with "
                           "train_micro_batch_size_per_gpu=B or gradient_accumulation_steps=K "
                           "instead of %s",
                           o->config, o->micro_batch ? "--micro-batch" : "--accum");
    if (!o->config && o->params <= 0)
        return usage_error(sizes ? "--params: required with --layers/--hidden/--seq"
                                 : "expected CONFIG.json or --params N --layers L --hidden H "
                                   "--seq S");
    if (!o->config && (!o->layers || !o->hidden || !o->seq))
        return usage_error("--params needs --layers, --hidden and --seq%s%s%s",
                           o->layers ? "" : " (missing --layers)",
                           o->hidden ? "" : " (missing --hidden)", o->seq ? "" : " (missing --seq)");
    if (o->tokens > 0 && o->hours > 0)
        return usage_error("--tokens and --hours-1gpu both give the work: give one");
    if (o->nodes_m && o->gpus_per_node && o->gpus_per_node != o->nodes_g)
        return usage_error("--nodes %dx%d and --gpus-per-node %d disagree", o->nodes_m,
                           o->nodes_g, o->gpus_per_node);
    if (o->measure && o->json)
        return usage_error("--measure prints a text comparison after the tables: drop --json");
    if (o->measure && !o->config)
        return usage_error("--measure runs a config: give CONFIG.json instead of --params");
    if (o->precision && strcasecmp(o->precision, "bf16") && strcasecmp(o->precision, "fp32"))
        return usage_error("--precision: expected bf16 or fp32, found \"%s\"", o->precision);
    if (o->comm_dtype && strcasecmp(o->comm_dtype, "bf16") && strcasecmp(o->comm_dtype, "fp32"))
        return usage_error("--comm-dtype: expected bf16 or fp32, found \"%s\"", o->comm_dtype);
    return 0;
}

/* ---- the model and hardware ------------------------------------------------ */


static double host_mem_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    double kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

/* The config's vocabulary: given, else what the data implies (256 for text,
 * 50257 for GPT-2 token shards, as the trainer decides). */
static int config_vocab(const dt_config_t *cfg, const char **why) {
    *why = "";
    if (cfg->model.vocab_size > 0) return (int)cfg->model.vocab_size;
    const char *t = cfg->data.train ? cfg->data.train : "";
    size_t n = strlen(t);
    if (n >= 4 && !strcmp(t + n - 4, ".bin")) {
        *why = " (vocab 50257 from the token shards)";
        return 50257;
    }
    *why = " (vocab 256: text data)";
    return 256;
}

/* Gradient accumulation of the config at world size n (its global batch is kept). */
static int config_accum(dt_config_t *cfg, int n, int *accum) {
    if (dt_config_resolve(cfg, n) != DT_STATUS_OK)
        return usage_error("--gpus %d: the config's batch sizes do not fit %d GPUs (%lld data-parallel):\n%s", n, n,
                           (long long)(n / (cfg->tp.size > 0 ? cfg->tp.size : 1)), dt_config_errors(cfg));
    *accum = (int)cfg->gradient_accumulation_steps;
    return 0;
}

static int load_config(plan_opts *o, plan_ctx *c, int *is_cpu_default) {
    dt_config_t *cfg = &c->cfg;
    c->have_cfg = 1;
    if (dt_config_load(o->config, o->overrides, o->n_overrides, cfg) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun plan: %s", dt_config_errors(cfg));
        return DT_EXIT_USAGE;
    }
    const char *why = "";
    dt_model_spec spec;
    dt_model_spec_copy(&cfg->model, &spec);
    if (spec.ops->data == DT_MODEL_DATA_TOKENS) spec.vocab_size = config_vocab(cfg, &why);
    c->spec = spec;
    c->have_spec = 1;
    dt_model_layout l;
    if (dt_model_layout_init(&spec, &l) != DT_STATUS_OK)
        return usage_error("%s: %s", o->config, dt_error_detail());
    dt_plan_model_from_layout(&l, &c->in.model);
    int n = snprintf(c->model_label, sizeof c->model_label, "%s: ", o->config);
    if (n >= 0 && (size_t)n < sizeof c->model_label)
        spec.ops->describe(&l, why, c->model_label + n, sizeof c->model_label - (size_t)n);
    dt_model_layout_free(&l);
    /* micro-batch and accumulation come per GPU count from dt_config_resolve */
    c->cfg_bf16 = cfg->bf16.enabled;
    c->cfg_comm_bytes = cfg->communication_data_type == DT_CONFIG_DTYPE_BF16 ? 2 : 4;
    c->in.bucket_elems = (double)cfg->zero.reduce_bucket_size;
    c->cfg_threads = (int)cfg->threads;
    c->cfg_tp = cfg->tp.size > 1 ? (int)cfg->tp.size : 1;
    o->highlight_strategy = (int)cfg->strategy;
    *is_cpu_default = cfg->device == DT_CONFIG_DEVICE_CPU;
    return 0;
}

/* The model: from the config or from the sizes given as flags. */
static int load_model(plan_opts *o, plan_ctx *c, int *is_cpu_default) {
    *is_cpu_default = 0;
    c->cfg_bf16 = 1;
    c->cfg_comm_bytes = 0;
    if (o->config) return load_config(o, c, is_cpu_default);
    /* default heads: head dimension 128 (Llama), else 64 (GPT-2), else one head */
    int heads = o->heads                                   ? o->heads
                : o->hidden % 128 == 0                     ? o->hidden / 128
                : o->hidden % 64 == 0                      ? o->hidden / 64
                                                           : 1;
    int vocab = o->vocab ? o->vocab : 50304;
    /* Llama-shaped with --kv-heads or --ffn (key/value heads default to the heads) */
    int shaped = o->kv_heads || o->ffn;
    if (shaped && !o->ffn) return usage_error("--kv-heads: give the MLP's width too (--ffn I)");
    dt_status_t st = shaped ? dt_plan_model_from_shape(o->params, o->layers, o->hidden, heads,
                                                       o->kv_heads ? o->kv_heads : heads, o->ffn, o->seq, vocab,
                                                       &c->in.model)
                            : dt_plan_model_from_sizes(o->params, o->layers, o->hidden, heads, o->seq, vocab,
                                                       &c->in.model);
    if (st != DT_STATUS_OK) return usage_error("%s", dt_error_detail());
    c->in.micro_batch = o->micro_batch ? o->micro_batch : 1;
    char shape[96] = "";
    if (shaped)
        snprintf(shape, sizeof shape, ", %d key/value heads, ffn %d (Llama-shaped, untied)",
                 o->kv_heads ? o->kv_heads : heads, o->ffn);
    snprintf(c->model_label, sizeof c->model_label,
             "%.4g parameters (given), %d layers, hidden %d, %d heads%s, seq %d, vocab %d",
             o->params, o->layers, o->hidden, heads, shape, o->seq, vocab);
    return 0;
}

/* CPU threads of each of n ranks on this host: the config's `threads`, else what
 * the trainer gets by default: all cores for one rank, one each for several
 * (OMP_NUM_THREADS=1 with more than one worker, CONTRACT.md). */
static int cpu_threads(const plan_ctx *c, int n) {
    if (c->cfg_threads > 0) return c->cfg_threads;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return n == 1 && cores > 1 ? (int)cores : 1;
}

static int setup(plan_opts *o, plan_ctx *c) {
    dt_plan_input_defaults(&c->in);
    int cpu_default = 0;
    int rc = load_model(o, c, &cpu_default);
    if (rc) return rc;
    if (o->accum) c->in.accum = o->accum;

    const char *gname = o->gpu ? o->gpu : (cpu_default ? "cpu" : "h100");
    c->gpu = dt_gpu_spec_find(gname);
    if (!c->gpu) {
        char names[512];
        dt_gpu_spec_names(names, sizeof names);
        return usage_error("--gpu: unknown GPU \"%s\" (known: %s; or give --gpu-mem GiB "
                           "--gpu-tflops T)",
                           gname, names);
    }
    int is_cpu = !strcmp(c->gpu->name, "cpu");
    c->in.precision = is_cpu || !c->cfg_bf16 ? DT_PLAN_PRECISION_FP32 : DT_PLAN_PRECISION_BF16;
    if (o->precision)
        c->in.precision = strcasecmp(o->precision, "fp32") ? DT_PLAN_PRECISION_BF16
                                                           : DT_PLAN_PRECISION_FP32;
    c->in.comm_bytes = c->in.precision == DT_PLAN_PRECISION_BF16 ? 2 : 4;
    if (c->cfg_comm_bytes && !is_cpu) c->in.comm_bytes = c->cfg_comm_bytes;
    if (o->comm_dtype) c->in.comm_bytes = strcasecmp(o->comm_dtype, "fp32") ? 2 : 4;
    c->in.gpu_attention = !is_cpu;
    if (!is_cpu) { /* model the attention the CUDA backend will run */
        dt_attention_kind_t ak;
        if (dt_attention_kind_from_env(&ak) != DT_STATUS_OK) return usage_error("%s", dt_error_detail());
        c->in.gpu_attention_fused = ak == DT_ATTENTION_FUSED;
    }
    c->in.mem_bytes = is_cpu ? host_mem_bytes() : c->gpu->mem_gib * 1073741824.0;
    c->in.mem_shared = is_cpu;
    if (is_cpu) {
        c->in.cpu_threads = cpu_threads(c, 1);
        c->in.peak_flops = cpu_peak_flops(c->in.cpu_threads);
    } else {
        c->in.peak_flops = c->gpu->tflops * 1e12;
    }
    if (o->gpu_mem > 0) c->in.mem_bytes = o->gpu_mem * 1073741824.0;
    if (o->gpu_tflops > 0) c->in.peak_flops = o->gpu_tflops * 1e12;
    if (o->mfu > 0) c->in.mfu = o->mfu;
    if (o->reserve >= 0) c->in.reserve = o->reserve;
    if (!(c->in.mem_bytes > 0)) return usage_error("--gpu-mem: the memory size is unknown; give it");
    if (!(c->in.peak_flops > 0))
        return usage_error("--gpu-tflops: the peak FLOP/s is unknown; give it");
    snprintf(c->gpu_label, sizeof c->gpu_label, "%s", c->gpu->name);

    char names[512];
    const char *intra = o->intra_link ? o->intra_link : c->gpu->intra_link;
    const dt_plan_link *li = dt_plan_link_find(intra);
    if (!li) {
        dt_plan_link_names(names, sizeof names);
        return usage_error("--intra-link: unknown link \"%s\" (known: %s)", intra, names);
    }
    c->in.intra = *li;
    const char *inter = o->link ? o->link : "ib400";
    const dt_plan_link *le = dt_plan_link_find(inter);
    if (!le) {
        dt_plan_link_names(names, sizeof names);
        return usage_error("--link: unknown link \"%s\" (known: %s)", inter, names);
    }
    c->in.inter = *le;
    if (o->intra_gbps > 0) {
        c->in.intra.gbps = o->intra_gbps;
        c->in.intra.name = "given";
    }
    if (o->link_gbps > 0) {
        c->in.inter.gbps = o->link_gbps;
        c->in.inter.name = "given";
    }
    if (o->nodes_g) c->in.gpus_per_node = o->nodes_g;
    else if (o->gpus_per_node) c->in.gpus_per_node = o->gpus_per_node;
    else if (is_cpu) c->in.gpus_per_node = 0; /* every rank on this host */

    double fpt = c->in.model.flops_per_token;
    if (o->hours > 0) {
        c->in.hours_1gpu = o->hours;
        snprintf(c->work_label, sizeof c->work_label, "%.4g one-GPU hours (given)", o->hours);
    } else if (o->tokens > 0) {
        c->in.hours_1gpu = o->tokens * fpt / (c->in.peak_flops * c->in.mfu) / 3600.0;
        snprintf(c->work_label, sizeof c->work_label,
                 "%.4g tokens x %.4g FLOPs/token at %.0f%% of peak = %.4g one-GPU hours",
                 o->tokens, fpt, 100 * c->in.mfu, c->in.hours_1gpu);
    } else {
        snprintf(c->work_label, sizeof c->work_label,
                 "not given (--tokens or --hours-1gpu for time and cost)");
    }
    if (o->price >= 0) c->in.price = o->price;
    return 0;
}

/* The model at TP size tp: rank 0's TP layout of the config's model, or the sized
 * model cut by dt_plan_model_set_tp. Returns 0, or 1 with msg naming what does not
 * divide (the caller prefixes --tp). */
static int tp_model(const plan_opts *o, const plan_ctx *c, int tp, dt_plan_model *out, char *msg, size_t len) {
    if (c->have_spec) {
        if (dt_model_tp_check(&c->spec, tp, msg, len)) return 1;
        dt_model_layout l;
        if (dt_model_layout_init_tp(&c->spec, tp, 0, o->sp, &l) != DT_STATUS_OK) {
            snprintf(msg, len, "%s", dt_error_detail());
            return 1;
        }
        dt_plan_model_from_layout(&l, out);
        dt_model_layout_free(&l);
        return 0;
    }
    *out = c->in.model;
    out->unit_numel = NULL; /* sized models have none; the copy must not share it */
    if (dt_plan_model_set_tp(out, tp, o->sp) != DT_STATUS_OK) {
        snprintf(msg, len, "%s", dt_error_detail());
        return 1;
    }
    return 0;
}

/* The TP sizes and their models: --tp's (each must divide the GPUs per node and
 * the model, else exit 2 naming --tp), --tp auto's (the powers of two up to the
 * GPUs per node that divide it and the model), or 1. */
static int setup_tp(plan_opts *o, plan_ctx *c) {
    int g = c->in.gpus_per_node;
    char msg[512];
    if (o->tp_auto) {
        int most = 1;
        for (int i = 0; i < o->n_counts; i++) most = o->counts[i] > most ? o->counts[i] : most;
        int top = g > 0 ? g : most;
        for (int t = 1; t <= top && o->n_tps < MAX_TP_SIZES; t *= 2) {
            if ((g > 0 && g % t) || (c->in.model.feature_rows && t > 1)) continue;
            dt_plan_model m;
            if (tp_model(o, c, t, &m, msg, sizeof msg)) continue;
            dt_plan_model_free(&m);
            o->tps[o->n_tps++] = t;
        }
    }
    if (!o->n_tps) { /* the config's tensor_parallel section, else 1 */
        o->tps[o->n_tps++] = c->have_cfg ? (int)c->cfg.tp.size : 1;
        if (c->have_cfg && c->cfg.tp.sequence_parallel) o->sp = 1;
    }
    for (int k = 0; k < o->n_tps; k++) {
        int t = o->tps[k];
        for (int j = 0; j < k; j++)
            if (o->tps[j] == t) return usage_error("--tp: %d is listed twice", t);
        if (t > 1 && g > 0 && g % t)
            return usage_error("--tp %d: does not divide the %d GPUs per node (a TP group is consecutive GPUs "
                               "of one node; set --gpus-per-node or --nodes MxG)",
                               t, g);
        if (tp_model(o, c, t, &c->tp_models[k], msg, sizeof msg))
            return usage_error("--tp %d: %s", t, msg);
        c->n_tp_models = k + 1;
    }
    return 0;
}

/* GPU counts: given, else from --nodes (powers of two up to G, then multiples of G),
 * else 1,2,4,8 (cpu: 1,2). */
static void default_counts(plan_opts *o, int is_cpu) {
    if (o->n_counts) return;
    if (o->nodes_m) {
        int total = o->nodes_m * o->nodes_g;
        for (int n = 1; n < o->nodes_g && o->n_counts < MAX_GPU_COUNTS - 1; n *= 2)
            o->counts[o->n_counts++] = n;
        for (int n = o->nodes_g; n < total && o->n_counts < MAX_GPU_COUNTS - 1; n *= 2)
            o->counts[o->n_counts++] = n;
        o->counts[o->n_counts++] = total;
        return;
    }
    static const int gpu_default[] = {1, 2, 4, 8};
    int n = is_cpu ? 2 : 4;
    for (int i = 0; i < n; i++) o->counts[o->n_counts++] = gpu_default[i];
}

/* Sets the micro-batch and accumulation of the input for n GPUs: a config keeps
 * its global batch (DeepSpeed's rules in dt_config_resolve). */
static int row_input(const plan_opts *o, plan_ctx *c, int n, int tp, int pp) {
    if (c->in.mem_shared) { /* CPU ranks: threads and their measured peak */
        c->in.cpu_threads = cpu_threads(c, n);
        if (o->gpu_tflops <= 0) c->in.peak_flops = cpu_peak_flops(c->in.cpu_threads);
    }
    if (c->have_cfg) {
        /* this row's TP size and pipeline: the batch divides over DP = n / (tp x pp);
         * the plan checks the row's schedule itself (cmd_plan_pp.c), so the config
         * resolves as one stage of n / pp ranks */
        c->cfg.tp.size = tp;
        c->cfg.pp.stages = 1;
        int rc = config_accum(&c->cfg, n / pp, &c->in.accum);
        if (rc) return rc;
        c->in.micro_batch = (int)c->cfg.train_micro_batch_size_per_gpu;
    }
    return 0;
}

/* The rows of one (strategy, TP size, pipeline layout) at every GPU count TP x PP
 * divides, appended at rows[*r]. Returns 0 or an exit code. */
static int plan_rows(const plan_opts *o, plan_ctx *c, int strategy, int k, const plan_pp_layout *pl,
                     dt_plan_row *rows, int *r) {
    dt_plan_model pm;
    const dt_plan_model *mm = &c->tp_models[k];
    char msg[512];
    int rc = 0;
    /* a strategy the trainer does not run with a model-parallel dim (the strategy table:
     * hsdp, whose shard group is a node's ranks, where TP groups and stages live): no row */
    if ((o->tps[k] > 1 && !dt_strategy_composes(strategy, DT_LAYOUT_TP)) ||
        (pl->pp > 1 && !dt_strategy_composes(strategy, DT_LAYOUT_PP)))
        return 0;
    if (pl->pp > 1) {
        if (cmd_plan_pp_model(o, c, mm, pl, &pm, msg, sizeof msg))
            return o->pp_auto ? 0 : usage_error("%s", msg);
        mm = &pm;
    }
    for (int i = 0; i < o->n_counts; i++) {
        dt_layout_dims dims = dt_layout_dims_tp_pp(o->tps[k], pl->pp);
        dt_layout lay;
        if (dt_layout_of(&dims, o->counts[i], 0, &lay) != DT_STATUS_OK) continue; /* TP x PP does not divide it */
        rc = row_input(o, c, o->counts[i], o->tps[k], pl->pp);
        if (rc) break;
        if (pl->pp > 1 && o->pp_auto &&
            dt_pp_schedule_check(pl->schedule, pl->pp, pl->virtual_stages, c->in.accum, msg, sizeof msg))
            continue; /* auto leaves out what the schedule cannot run */
        dt_plan_input in = c->in;
        in.model = *mm;
        in.pp_schedule = pl->schedule;
        if (dt_plan_row_compute(&in, strategy, o->counts[i], &rows[(*r)++]) != DT_STATUS_OK) {
            rc = usage_error("%s", dt_error_detail());
            break;
        }
    }
    if (mm == &pm) dt_plan_model_free(&pm);
    return rc;
}

/* The cheapest row's stages (a pipeline) into c->stages and c->stage_rows. */
static int cheapest_stages(const plan_opts *o, plan_ctx *c, const dt_plan_row *row) {
    int k = 0;
    while (k < o->n_tps && o->tps[k] != row->tp) k++;
    plan_pp_layout pl = {row->pp, row->virtual_stages, row->schedule};
    dt_plan_model pm;
    char msg[512];
    if (k == o->n_tps || cmd_plan_pp_model(o, c, &c->tp_models[k], &pl, &pm, msg, sizeof msg)) return 0;
    int rc = row_input(o, c, row->n_gpus, row->tp, row->pp);
    if (!rc) {
        dt_plan_input in = c->in;
        in.model = pm;
        in.pp_schedule = pl.schedule;
        dt_plan_row again;
        if (dt_plan_row_compute_pp(&in, row->strategy, row->n_gpus, &again, c->stage_rows) == DT_STATUS_OK) {
            c->n_stages = row->pp;
            for (int s = 0; s < row->pp; s++) {
                c->stages[s] = pm.stages[s];
                c->stages[s].unit_numel = NULL; /* freed with pm */
            }
        }
    }
    dt_plan_model_free(&pm);
    return rc;
}

/* ---- the command ------------------------------------------------------------------ */

int dt_cmd_plan(int argc, char **argv) {
    plan_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc < 0) {
        char gpus_s[512], links_s[512];
        dt_gpu_spec_names(gpus_s, sizeof gpus_s);
        dt_plan_link_names(links_s, sizeof links_s);
        printf(cmd_plan_help_text, gpus_s, links_s);
        return DT_EXIT_OK;
    }
    if (rc) return rc;
    plan_ctx c;
    memset(&c, 0, sizeof c);
    rc = setup(&o, &c);
    if (rc) goto out_free_model;
    default_counts(&o, c.in.mem_shared);
    rc = setup_tp(&o, &c);
    if (rc) goto out_free_model;
    rc = cmd_plan_setup_pp(&o, &c);
    if (rc) goto out_free_model;
    if (!o.n_strategies)
        for (int s = 0; s < DT_STRATEGY_COUNT; s++) o.strategies[o.n_strategies++] = s;

    /* a row per (strategy, TP size, pipeline layout, GPU count) where TP x PP divides
     * the count (and, under --pp auto, the schedule can run) */
    int n_rows = o.n_strategies * o.n_tps * o.n_layouts * o.n_counts;
    dt_plan_row *rows = dt_xcalloc((size_t)n_rows, sizeof *rows);
    int r = 0;
    for (int s = 0; s < o.n_strategies; s++)
        for (int k = 0; k < o.n_tps; k++)
            for (int j = 0; j < o.n_layouts; j++) {
                rc = plan_rows(&o, &c, o.strategies[s], k, &o.layouts[j], rows, &r);
                if (rc) goto out_free_rows;
            }
    n_rows = r;
    if (!n_rows) {
        rc = usage_error("--tp/--pp: no GPU count of --gpus is a multiple of a TP x PP size given (world = TP x "
                         "PP x DP)");
        goto out_free_rows;
    }
    rc = row_input(&o, &c, rows[0].n_gpus, rows[0].tp, rows[0].pp); /* the header shows the first row's batch */
    if (rc) goto out_free_rows;
    dt_plan_choice ch;
    dt_plan_recommend(&c.in, rows, n_rows, &ch);
    if (ch.cheapest >= 0 && rows[ch.cheapest].pp > 1) {
        rc = cheapest_stages(&o, &c, &rows[ch.cheapest]);
        if (rc) goto out_free_rows;
    }
    if (o.json && (o.lora_r || o.base_dtype || o.lora_targets)) { /* not silently dropped */
        rc = usage_error("--lora-r/--base-dtype/--lora-targets: the LoRA section is not in --json's output yet; "
                         "run without --json");
        goto out_free_rows;
    }
    if (o.json) cmd_plan_print_json(&o, &c, rows, n_rows, &ch);
    else cmd_plan_print_text(&o, &c, rows, n_rows, &ch);
    rc = o.json ? DT_EXIT_OK : cmd_plan_print_lora(&o, &c);
    fflush(stdout);
    if (rc) goto out_free_rows;
    if (o.measure) {
        /* the config's strategy at the first GPU count */
        int want = o.highlight_strategy >= 0 ? o.highlight_strategy : DT_STRATEGY_DDP;
        int tp = c.have_cfg ? c.cfg_tp : 1, k = 0;
        while (k < o.n_tps && o.tps[k] != tp) k++;
        if (k == o.n_tps) {
            rc = usage_error("--measure: the config runs at tensor_parallel.size %d: give --tp %d", tp, tp);
            goto out_free_rows;
        }
        dt_plan_row est;
        rc = row_input(&o, &c, o.counts[0], tp, 1); /* the config's run, at its TP size */
        if (rc) goto out_free_rows;
        dt_plan_input in = c.in;
        in.model = c.tp_models[k];
        if (dt_plan_row_compute(&in, want, o.counts[0], &est) != DT_STATUS_OK) {
            rc = usage_error("%s", dt_error_detail());
            goto out_free_rows;
        }
        rc = cmd_plan_measure(&o, &est);
    }
out_free_rows:
    free(rows);
out_free_model:
    for (int k = 0; k < c.n_tp_models; k++) dt_plan_model_free(&c.tp_models[k]);
    dt_plan_model_free(&c.in.model);
    if (c.have_cfg) dt_config_free(&c.cfg);
    return rc;
}
