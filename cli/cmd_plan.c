/*
 * cmd_plan.c - dtrun plan [CONFIG.json [KEY=VALUE ...]] [PLAN FLAGS]: per-GPU
 * memory, step time, scaling efficiency, time and cost of each strategy at each
 * GPU count, and a recommendation (the sweep is runtime/tools/plan_sweep.c, one row's
 * arithmetic plan.c; this file parses the flags and sets up the input). --measure
 * runs the config for a few steps and prints the measurement beside the estimate.
 *
 * --json keys (stable; bytes, seconds, FLOP/s; null where unknown):
 *   model {source, type, params, params_unpadded, flops_per_token, micro_batch, accum,
 *          seq_len, precision, strategy (with a config)}
 *   gpu {name, mem_bytes, mem_shared, peak_flops, mfu, reserve}
 *   links {intra {name, bytes_per_s, alpha_s}, inter {...}, gpus_per_node}
 *   work {hours_1gpu, tokens, price}
 *   rows [{strategy, gpus, nodes, shard, tp, cp, dp, micro_batch, accum,
 *          memory_bytes {params, grads, optim, model_states, activations,
 *                        activations_ckpt, comm_buffers, total, total_ckpt, usable},
 *          fits ("yes" | "ckpt" | "no"),
 *          step_s {compute, comm, overlapped, exposed, tp_comm, total} (comm and
 *          exposed include tp_comm), collectives, efficiency, tokens_per_s, hours, cost,
 *          ring {bytes, s, exposed_s, inter_node} (context parallelism's ring per
 *          step: bytes a rank sends, their time, the exposed part; zeros at cp 1)}]
 *   recommendation {cheapest {strategy, gpus, tp, cp, row, reason}, fastest {...},
 *                   tp (why the TP size; "" when every row is TP 1),
 *                   cp (why the CP size; "" when every row is CP 1)}
 *   model also has tp_sizes [..], cp_sizes [..] and sequence_parallel
 */
#include <cjson/cJSON.h>
#include <float.h>
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
#include "runtime/train/data.h" /* defines: dt_data_header_vocab */
#include "runtime/config/config.h"
#include "runtime/train/metrics.h"
#include "runtime/model/model.h"
#include "runtime/layout/pp_sched.h" /* defines: dt_pp_schedule_check */
#include "runtime/tools/plan.h"
#include "cli/args.h" /* defines: dt_arg_int, dt_arg_double, dt_arg_count */
#include "cli/cmd_plan.h"

/* Integers of the plan's flags stay within this (far from int overflow). */
#define PLAN_INT_MAX 1000000000L



#define usage_error cmd_plan_usage_error

/* Flags that take a value; a flag in both spellings ('_' or '-') is accepted. */
static const char *const value_flags[] = {
    "--params", "--layers", "--hidden", "--heads", "--seq", "--vocab", "--micro-batch",
    "--accum", "--gpus", "--gpu", "--gpu-mem", "--gpu-tflops", "--mfu", "--reserve",
    "--nodes", "--gpus-per-node", "--link", "--link-gbps", "--intra-link",
    "--intra-link-gbps", "--tokens", "--hours-1gpu", "--price", "--strategy",
    "--precision", "--comm-dtype", "--measure-steps", "--tp", "--cp", "--pp", "--schedule", "--virtual-stages",
    "--partition", "--kv-heads", "--ffn", "--lora-r", "--base-dtype", "--lora-targets", NULL};

/* --tp 1,2,4,8 or --tp auto */
static int parse_list_tp(const char *s, plan_opts *o) {
    o->ax.n_tps = 0;
    o->ax.tp_auto = !strcasecmp(s, "auto");
    if (o->ax.tp_auto) return 0;
    char buf[256];
    if (strlen(s) >= sizeof buf) return usage_error("--tp: the list is too long");
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int v;
        if (dt_arg_int(t, 1, 4096, &v))
            return usage_error("--tp: expected TP sizes >= 1 like 1,2,4,8 (or auto), found \"%s\"", s);
        if (o->ax.n_tps == MAX_TP_SIZES) return usage_error("--tp: at most %d sizes", MAX_TP_SIZES);
        o->ax.tps[o->ax.n_tps++] = v;
    }
    if (!o->ax.n_tps) return usage_error("--tp: expected a list of TP sizes like 1,2,4,8 (or auto)");
    return 0;
}

/* --cp 1,2,4 */
static int parse_list_cp(const char *s, plan_opts *o) {
    o->ax.n_cps = 0;
    char buf[256];
    if (strlen(s) >= sizeof buf) return usage_error("--cp: the list is too long");
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int v;
        if (dt_arg_int(t, 1, 4096, &v)) return usage_error("--cp: expected CP sizes >= 1 like 1,2,4, found \"%s\"", s);
        if (o->ax.n_cps == DT_PLAN_SWEEP_MAX_CP) return usage_error("--cp: at most %d sizes", DT_PLAN_SWEEP_MAX_CP);
        o->ax.cps[o->ax.n_cps++] = v;
    }
    if (!o->ax.n_cps) return usage_error("--cp: expected a list of CP sizes like 1,2,4");
    return 0;
}

static int parse_list_counts(const char *s, plan_opts *o) {
    char buf[512];
    if (strlen(s) >= sizeof buf) return usage_error("--gpus: the list is too long");
    snprintf(buf, sizeof buf, "%s", s);
    o->ax.n_counts = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int v;
        if (dt_arg_int(t, 1, PLAN_MAX_GPUS, &v))
            return usage_error("--gpus: expected a list of GPU counts >= 1 like 1,2,4,8, found "
                               "\"%s\"",
                               s);
        if (o->ax.n_counts == MAX_GPU_COUNTS)
            return usage_error("--gpus: at most %d counts", MAX_GPU_COUNTS);
        o->ax.counts[o->ax.n_counts++] = v;
    }
    if (!o->ax.n_counts) return usage_error("--gpus: expected a list of GPU counts like 1,2,4,8");
    return 0;
}

static int parse_list_strategies(const char *s, plan_opts *o) {
    char buf[256];
    if (strlen(s) >= sizeof buf) return usage_error("--strategy: the list is too long");
    snprintf(buf, sizeof buf, "%s", s);
    o->ax.n_strategies = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int v = dt_strategy_parse(t);
        if (v < 0)
            return usage_error("--strategy: unknown strategy \"%s\" (known: ddp, zero1, zero2, "
                               "fsdp, hybrid)",
                               t);
        if (o->ax.n_strategies < DT_STRATEGY_COUNT) o->ax.strategies[o->ax.n_strategies++] = v;
    }
    if (!o->ax.n_strategies) return usage_error("--strategy: expected a list like ddp,fsdp");
    return 0;
}

/* Returns 0, or an exit code. */
static int parse_args(int argc, char **argv, plan_opts *o) {
    memset(o, 0, sizeof *o);
    o->gpu_mem = o->gpu_tflops = o->link_gbps = o->intra_gbps = o->mfu = o->reserve = -1;
    o->tokens = o->hours = o->price = -1;
    o->measure_steps = 5;
    o->highlight_strategy = -1;
    o->ax.schedule = o->ax.partition = -1;
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
            else o->ax.sp = 1;
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
            if (dt_arg_count(val, 1, DBL_MAX, &o->params))
                return usage_error("--params: expected a parameter count like 7e9 or 124M, "
                                   "found \"%s\"",
                                   val);
        } else if (!strcmp(flag, "--layers")) bad = dt_arg_int(val, 1, PLAN_INT_MAX, &o->layers);
        else if (!strcmp(flag, "--hidden")) bad = dt_arg_int(val, 1, PLAN_INT_MAX, &o->hidden);
        else if (!strcmp(flag, "--heads")) bad = dt_arg_int(val, 1, PLAN_INT_MAX, &o->heads);
        else if (!strcmp(flag, "--kv-heads")) bad = dt_arg_int(val, 1, PLAN_INT_MAX, &o->kv_heads);
        else if (!strcmp(flag, "--ffn")) bad = dt_arg_int(val, 1, PLAN_INT_MAX, &o->ffn);
        else if (!strcmp(flag, "--seq")) bad = dt_arg_int(val, 1, PLAN_INT_MAX, &o->seq);
        else if (!strcmp(flag, "--vocab")) bad = dt_arg_int(val, 1, PLAN_INT_MAX, &o->vocab);
        else if (!strcmp(flag, "--micro-batch"))
            bad = dt_arg_int(val, 1, PLAN_INT_MAX, &o->micro_batch);
        else if (!strcmp(flag, "--accum")) bad = dt_arg_int(val, 1, PLAN_INT_MAX, &o->accum);
        else if (!strcmp(flag, "--measure-steps"))
            bad = dt_arg_int(val, 1, PLAN_INT_MAX, &o->measure_steps);
        else if (!strcmp(flag, "--gpus-per-node"))
            bad = dt_arg_int(val, 1, PLAN_MAX_GPUS, &o->gpus_per_node);
        else if (!strcmp(flag, "--gpus")) {
            int rc = parse_list_counts(val, o);
            if (rc) return rc;
        } else if (!strcmp(flag, "--strategy")) {
            int rc = parse_list_strategies(val, o);
            if (rc) return rc;
        } else if (!strcmp(flag, "--tp")) {
            int rc = parse_list_tp(val, o);
            if (rc) return rc;
        } else if (!strcmp(flag, "--cp")) {
            int rc = parse_list_cp(val, o);
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
            if (dt_arg_count(val, -DBL_MAX, 1e18, &o->tokens) || o->tokens <= 0)
                return usage_error("--tokens: expected a token count in (0, 1e18] like 1e10 or 10B, "
                                   "found \"%s\"",
                                   val);
        } else {
            if (dt_arg_double(val, -DBL_MAX, DBL_MAX, &d))
                return usage_error("%s: expected a number, found \"%s\"", flag, val);
            /* Bounds that keep every estimate finite (issue 31: --tokens 1e300 or
             * --gpu-tflops 1e-300 printed "inf one-GPU hours"). */
            static const struct { const char *flag; double lo, hi; } range[] = {
                {"--gpu-mem", 1e-3, 1e6},   {"--gpu-tflops", 1e-3, 1e6}, {"--link-gbps", 1e-3, 1e6},
                {"--intra-link-gbps", 1e-3, 1e6}, {"--hours-1gpu", 1e-6, 1e12}, {"--price", 0, 1e6}};
            for (size_t k = 0; k < sizeof range / sizeof *range; k++)
                if (!strcmp(flag, range[k].flag) && !(d >= range[k].lo && d <= range[k].hi))
                    return usage_error("%s: expected a number in [%g, %g], found \"%s\"", flag, range[k].lo,
                                       range[k].hi, val);
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

/* The config's vocabulary: given, else what the data implies (256 for text, the
 * vocabulary the shards' headers record, else 50257 for token shards, as the
 * trainer decides). */
static int config_vocab(const dt_config_t *cfg, const char **why) {
    *why = "";
    if (cfg->model.vocab_size > 0) return (int)cfg->model.vocab_size;
    const char *t = cfg->data.train ? cfg->data.train : "";
    size_t n = strlen(t);
    int recorded = 0;
    if (n >= 4 && !strcmp(t + n - 4, ".bin") && dt_data_header_vocab(t, &recorded, NULL, 0) == DT_STATUS_OK &&
        recorded > 0) {
        *why = " (vocab from the token shards' header)";
        return recorded;
    }
    dt_error_clear();
    if (n >= 4 && !strcmp(t + n - 4, ".bin")) {
        *why = " (vocab 50257 from the token shards)";
        return 50257;
    }
    *why = " (vocab 256: text data)";
    return 256;
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
    dt_plan_model_from_layout(&l, &c->sw.in.model);
    int n = snprintf(c->model_label, sizeof c->model_label, "%s: ", o->config);
    if (n >= 0 && (size_t)n < sizeof c->model_label)
        spec.ops->describe(&l, why, c->model_label + n, sizeof c->model_label - (size_t)n);
    dt_model_layout_free(&l);
    /* micro-batch and accumulation come per GPU count from dt_config_resolve */
    c->cfg_bf16 = cfg->bf16.enabled;
    c->cfg_comm_bytes = cfg->communication_data_type == DT_CONFIG_DTYPE_BF16 ? 2 : 4;
    c->sw.in.bucket_elems = (double)cfg->zero.reduce_bucket_size;
    c->sw.cfg_threads = (int)cfg->threads;
    c->cfg_tp = cfg->tp.size > 1 ? (int)cfg->tp.size : 1;
    c->cfg_cp = cfg->cp.size > 1 ? (int)cfg->cp.size : 1;
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
                                                       &c->sw.in.model)
                            : dt_plan_model_from_sizes(o->params, o->layers, o->hidden, heads, o->seq, vocab,
                                                       &c->sw.in.model);
    if (st != DT_STATUS_OK) return usage_error("%s", cmd_plan_detail());
    c->sw.in.micro_batch = o->micro_batch ? o->micro_batch : 1;
    char shape[96] = "";
    if (shaped)
        snprintf(shape, sizeof shape, ", %d key/value heads, ffn %d (Llama-shaped, untied)",
                 o->kv_heads ? o->kv_heads : heads, o->ffn);
    snprintf(c->model_label, sizeof c->model_label,
             "%.4g parameters (given), %d layers, hidden %d, %d heads%s, seq %d, vocab %d",
             o->params, o->layers, o->hidden, heads, shape, o->seq, vocab);
    return 0;
}

static int setup(plan_opts *o, plan_ctx *c) {
    dt_plan_input_defaults(&c->sw.in);
    int cpu_default = 0;
    int rc = load_model(o, c, &cpu_default);
    if (rc) return rc;
    if (o->accum) c->sw.in.accum = o->accum;

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
    c->sw.in.precision = is_cpu || !c->cfg_bf16 ? DT_PLAN_PRECISION_FP32 : DT_PLAN_PRECISION_BF16;
    if (o->precision)
        c->sw.in.precision = strcasecmp(o->precision, "fp32") ? DT_PLAN_PRECISION_BF16
                                                           : DT_PLAN_PRECISION_FP32;
    c->sw.in.comm_bytes = c->sw.in.precision == DT_PLAN_PRECISION_BF16 ? 2 : 4;
    if (c->cfg_comm_bytes && !is_cpu) c->sw.in.comm_bytes = c->cfg_comm_bytes;
    if (o->comm_dtype) c->sw.in.comm_bytes = strcasecmp(o->comm_dtype, "fp32") ? 2 : 4;
    c->sw.in.gpu_attention = !is_cpu;
    if (!is_cpu) { /* model the attention the CUDA backend will run */
        dt_attention_kind_t ak;
        if (dt_attention_kind_from_env(&ak) != DT_STATUS_OK) return usage_error("%s", dt_error_detail());
        c->sw.in.gpu_attention_fused = ak == DT_ATTENTION_FUSED;
    }
    c->sw.in.mem_bytes = is_cpu ? host_mem_bytes() : c->gpu->mem_gib * 1073741824.0;
    c->sw.in.mem_shared = is_cpu;
    if (is_cpu) {
        c->sw.in.cpu_threads = dt_plan_sweep_cpu_threads(&c->sw, 1);
        c->sw.in.peak_flops = dt_plan_cpu_peak_flops(c->sw.in.cpu_threads);
    } else {
        c->sw.in.peak_flops = c->gpu->tflops * 1e12;
    }
    if (o->gpu_mem > 0) c->sw.in.mem_bytes = o->gpu_mem * 1073741824.0;
    if (o->gpu_tflops > 0) c->sw.in.peak_flops = o->gpu_tflops * 1e12;
    if (o->mfu > 0) c->sw.in.mfu = o->mfu;
    if (o->reserve >= 0) c->sw.in.reserve = o->reserve;
    if (!(c->sw.in.mem_bytes > 0)) return usage_error("--gpu-mem: the memory size is unknown; give it");
    if (!(c->sw.in.peak_flops > 0))
        return usage_error("--gpu-tflops: the peak FLOP/s is unknown; give it");
    snprintf(c->gpu_label, sizeof c->gpu_label, "%s", c->gpu->name);

    char names[512];
    const char *intra = o->intra_link ? o->intra_link : c->gpu->intra_link;
    const dt_plan_link *li = dt_plan_link_find(intra);
    if (!li) {
        dt_plan_link_names(names, sizeof names);
        return usage_error("--intra-link: unknown link \"%s\" (known: %s)", intra, names);
    }
    c->sw.in.intra = *li;
    const char *inter = o->link ? o->link : "ib400";
    const dt_plan_link *le = dt_plan_link_find(inter);
    if (!le) {
        dt_plan_link_names(names, sizeof names);
        return usage_error("--link: unknown link \"%s\" (known: %s)", inter, names);
    }
    c->sw.in.inter = *le;
    if (o->intra_gbps > 0) {
        c->sw.in.intra.gbps = o->intra_gbps;
        c->sw.in.intra.name = "given";
    }
    if (o->link_gbps > 0) {
        c->sw.in.inter.gbps = o->link_gbps;
        c->sw.in.inter.name = "given";
    }
    if (o->nodes_g) c->sw.in.gpus_per_node = o->nodes_g;
    else if (o->gpus_per_node) c->sw.in.gpus_per_node = o->gpus_per_node;
    else if (is_cpu) c->sw.in.gpus_per_node = 0; /* every rank on this host */

    double fpt = c->sw.in.model.flops_per_token;
    if (o->hours > 0) {
        c->sw.in.hours_1gpu = o->hours;
        snprintf(c->work_label, sizeof c->work_label, "%.4g one-GPU hours (given)", o->hours);
    } else if (o->tokens > 0) {
        c->sw.in.hours_1gpu = o->tokens * fpt / (c->sw.in.peak_flops * c->sw.in.mfu) / 3600.0;
        snprintf(c->work_label, sizeof c->work_label,
                 "%.4g tokens x %.4g FLOPs/token at %.0f%% of peak = %.4g one-GPU hours",
                 o->tokens, fpt, 100 * c->sw.in.mfu, c->sw.in.hours_1gpu);
    } else {
        snprintf(c->work_label, sizeof c->work_label,
                 "not given (--tokens or --hours-1gpu for time and cost)");
    }
    if (o->price >= 0) c->sw.in.price = o->price;
    return 0;
}

/* GPU counts: given, else from --nodes (powers of two up to G, then multiples of G),
 * else 1,2,4,8 (cpu: 1,2). */
static void default_counts(plan_opts *o, int is_cpu) {
    if (o->ax.n_counts) return;
    if (o->nodes_m) {
        int total = o->nodes_m * o->nodes_g;
        for (int n = 1; n < o->nodes_g && o->ax.n_counts < MAX_GPU_COUNTS - 1; n *= 2)
            o->ax.counts[o->ax.n_counts++] = n;
        for (int n = o->nodes_g; n < total && o->ax.n_counts < MAX_GPU_COUNTS - 1; n *= 2)
            o->ax.counts[o->ax.n_counts++] = n;
        o->ax.counts[o->ax.n_counts++] = total;
        return;
    }
    static const int gpu_default[] = {1, 2, 4, 8};
    int n = is_cpu ? 2 : 4;
    for (int i = 0; i < n; i++) o->ax.counts[o->ax.n_counts++] = gpu_default[i];
}

/* ---- the command ------------------------------------------------------------------ */

int cmd_plan_sweep_error(const plan_ctx *c, dt_status_t st) {
    if (st == DT_STATUS_CONFIG && c->have_cfg) return usage_error("%s\n%s", cmd_plan_detail(), dt_config_errors(&c->cfg));
    return usage_error("%s", cmd_plan_detail());
}

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
    c.sw.ax = &o.ax;
    dt_plan_row *rows = NULL;
    int n_rows = 0;
    dt_status_t st;
    rc = setup(&o, &c);
    if (rc) goto out_free;
    c.sw.cfg = c.have_cfg ? &c.cfg : NULL;
    c.sw.spec = c.have_spec ? &c.spec : NULL;
    c.sw.peak_given = o.gpu_tflops > 0;
    default_counts(&o, c.sw.in.mem_shared);
    if ((st = dt_plan_sweep_setup_tp(&c.sw)) != DT_STATUS_OK || (st = dt_plan_sweep_setup_pp(&c.sw)) != DT_STATUS_OK) {
        rc = cmd_plan_sweep_error(&c, st);
        goto out_free;
    }
    if ((rc = cmd_plan_setup_lora(&o, &c))) goto out_free;
    if (!o.ax.n_strategies)
        for (int s = 0; s < DT_STRATEGY_COUNT; s++) o.ax.strategies[o.ax.n_strategies++] = s;
    dt_plan_choice ch;
    st = dt_plan_sweep_all(&c.sw, &rows, &n_rows, &ch);
    if (st != DT_STATUS_OK) {
        rc = cmd_plan_sweep_error(&c, st);
        goto out_free;
    }
    cmd_plan_expand(ch.cheapest_reason, sizeof ch.cheapest_reason);
    cmd_plan_expand(ch.fastest_reason, sizeof ch.fastest_reason);
    cmd_plan_expand(ch.tp_reason, sizeof ch.tp_reason);
    cmd_plan_expand(ch.cp_reason, sizeof ch.cp_reason);
    if (o.json) cmd_plan_print_json(&o, &c, rows, n_rows, &ch);
    else cmd_plan_print_text(&o, &c, rows, n_rows, &ch);
    if (!o.json) cmd_plan_print_lora(&c);
    fflush(stdout);
    if (o.measure) {
        /* the config's strategy at the first GPU count, at its TP size */
        int want = o.highlight_strategy >= 0 ? o.highlight_strategy : DT_STRATEGY_DDP;
        int tp = c.have_cfg ? c.cfg_tp : 1, k = 0;
        while (k < o.ax.n_tps && o.ax.tps[k] != tp) k++;
        if (k == o.ax.n_tps) {
            rc = usage_error("--measure: the config runs at tensor_parallel.size %d: give --tp %d", tp, tp);
            goto out_free;
        }
        dt_plan_row est;
        st = dt_plan_sweep_row(&c.sw, want, tp, c.have_cfg ? c.cfg_cp : 1, o.ax.counts[0], &est);
        if (st != DT_STATUS_OK) {
            rc = cmd_plan_sweep_error(&c, st);
            goto out_free;
        }
        rc = cmd_plan_measure(&o, &est);
    }
out_free:
    free(rows);
    dt_plan_sweep_free(&c.sw);
    if (c.have_lora) dt_plan_lora_free(&c.lora);
    if (c.have_cfg) dt_config_free(&c.cfg);
    return rc;
}
