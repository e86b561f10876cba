/*
 * config.c - the table-driven config loader (config.h).
 *
 * The key table (config_keys.c, config_impl.h: one row per key, as redis'
 * standardConfig) drives the defaults, parsing the JSON file with cJSON, type and
 * range errors and `KEY=VALUE` overrides here, and the JSON dump of the resolved
 * config and `dtrun config --keys` there. Cross-key rules (strategy vs ZeRO stage,
 * the model's own config_check) follow the table in finish(); the batch identity
 * is dt_config_resolve() (config_resolve.c). Every error and warning goes to the
 * collector (config_errors.c).
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
#include "runtime/config/config_impl.h"
#include "runtime/config/config_errors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/fs.h"  /* defines: dt_fs_printable, dt_fs_read_file */
#include "common/log.h" /* defines: DT_LOG_WARN */
#include "common/mem.h" /* defines: dt_xmalloc, dt_xrealloc, dt_xstrdup */

/* The collector's appends (config_errors.h), printf-style. */
__attribute__((format(printf, 3, 4))) static void add_error(dt_config_t *cfg, const char *src,
                                                            const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dt_config_add_verror_(cfg, src, fmt, ap);
    va_end(ap);
}

__attribute__((format(printf, 2, 3))) static void add_warning(dt_config_t *cfg, const char *fmt,
                                                              ...) {
    va_list ap;
    va_start(ap, fmt);
    dt_config_add_vwarning_(cfg, fmt, ap);
    va_end(ap);
}

/* ---- values ------------------------------------------------------------- */

typedef struct parse_ctx {
    dt_config_t *cfg;
    const char *src;           /* for messages: the file, or "override k=v" */
    dt_config_origin_t origin; /* where the values come from */
    unsigned char touched[DT_CONFIG_MAX_KEYS];
    dt_config_text ignored;    /* ", "-joined ignored keys */
    dt_config_text autos;      /* ", "-joined keys given as "auto" */
} parse_ctx_t;

/* A short JSON rendering of v for "found ..." (truncated). */
static void render(const cJSON *v, char *out, size_t size) {
    if (!v) {
        snprintf(out, size, "nothing");
        return;
    }
    if (cJSON_IsNumber(v) && !isfinite(v->valuedouble)) { /* cJSON's overflow: it would print null */
        snprintf(out, size, "a number out of range (beyond +-1.8e308)");
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

static bool in_bounds(const config_key_t *k, double x) {
    if (!isfinite(x)) return false;
    if ((k->flags & KF_MIN_EXCL) ? !(x > k->min) : !(x >= k->min)) return false;
    if ((k->flags & KF_MAX_EXCL) ? !(x < k->max) : !(x <= k->max)) return false;
    return true;
}


/* name: the key as the source spelled it (its path, or an alias of it). */
static void type_error(parse_ctx_t *ctx, const config_key_t *k, const char *name, const cJSON *v,
                       const char *extra) {
    char exp[256], found[80];
    dt_config_expected_(k, exp, sizeof exp);
    render(v, found, sizeof found);
    add_error(ctx->cfg, ctx->src, "%s: expected %s, found %s%s", name, exp, found,
              extra ? extra : "");
}

/* Frees data.train's list of sources. */
static void free_sources(dt_config_t *cfg) {
    for (int i = 0; i < cfg->data.n_sources; i++) free(cfg->data.sources[i].path);
    free(cfg->data.sources);
    cfg->data.sources = NULL;
    cfg->data.n_sources = 0;
}

/* data.train as a list of {"path": GLOB, "weight": W}: every error names the
 * item's key path (data.train[1].weight). The list replaces a string. */
static void set_sources(parse_ctx_t *ctx, const config_key_t *k, const cJSON *v) {
    dt_config_t *cfg = ctx->cfg;
    int n = cJSON_GetArraySize(v);
    char found[80];
    if (n == 0 || n > DT_CONFIG_MAX_SOURCES) {
        add_error(cfg, ctx->src, "%s: expected a path or glob, or a list of 1 to %d sources, found %s", k->path,
                  DT_CONFIG_MAX_SOURCES, n == 0 ? "an empty list" : "too many");
        return;
    }
    dt_config_source *list = dt_xcalloc((size_t)n, sizeof *list);
    int i = 0;
    for (const cJSON *item = v->child; item; item = item->next, i++) {
        list[i].weight = 1.0;
        if (!cJSON_IsObject(item)) {
            render(item, found, sizeof found);
            add_error(cfg, ctx->src, "%s[%d]: expected an object {\"path\": GLOB, \"weight\": W}, found %s",
                      k->path, i, found);
            continue;
        }
        for (const cJSON *m = item->child; m; m = m->next) {
            if (!strcmp(m->string, "path")) {
                if (!cJSON_IsString(m) || !m->valuestring[0]) {
                    render(m, found, sizeof found);
                    add_error(cfg, ctx->src, "%s[%d].path: expected a non-empty path or glob, found %s", k->path, i,
                              found);
                } else {
                    free(list[i].path);
                    list[i].path = dt_xstrdup(m->valuestring);
                }
            } else if (!strcmp(m->string, "weight")) {
                if (!cJSON_IsNumber(m) || !(m->valuedouble > 0) || !isfinite(m->valuedouble)) {
                    render(m, found, sizeof found);
                    add_error(cfg, ctx->src, "%s[%d].weight: expected a number > 0, found %s", k->path, i, found);
                } else {
                    list[i].weight = m->valuedouble;
                }
            } else {
                add_error(cfg, ctx->src, "%s[%d].%s: unknown key (a source has path and weight)", k->path, i,
                          m->string);
            }
        }
        if (!list[i].path && cJSON_IsObject(item) && !cJSON_GetObjectItemCaseSensitive(item, "path")) {
            add_error(cfg, ctx->src, "%s[%d].path: expected a path or glob, found nothing", k->path, i);
        }
    }
    free_sources(cfg);
    cfg->data.sources = list;
    cfg->data.n_sources = n; /* kept even with errors in it: they stop the run */
    char **s = (char **)field(cfg, k);
    free(*s);
    *s = NULL;
    cfg->origin[k - KEYS] = ctx->origin;
}

static void set_value_as(parse_ctx_t *ctx, int row, const char *name, const cJSON *v);

/* Sets key row from JSON value v; reports its own errors. */
static void set_value(parse_ctx_t *ctx, int row, const cJSON *v) { set_value_as(ctx, row, KEYS[row].path, v); }

/* Bytes of row k's field (what set_value writes). */
static size_t field_size(const config_key_t *k) {
    switch (k->type) {
    case KT_BOOL: return (k->flags & KF_INT32) ? sizeof(int) : sizeof(bool);
    case KT_INT: return (k->flags & KF_INT32) ? sizeof(int) : sizeof(int64_t);
    case KT_FLOAT: return sizeof(double);
    case KT_FLOAT2: return 2 * sizeof(double);
    case KT_ENUM: return sizeof(int);
    case KT_STRING: return 0; /* no string key has an alias */
    }
    return 0;
}

/* The key row given a second time in one source under its other name (an alias,
 * ctx->touched 1 = by its path, 2 = by the alias): the same value is accepted, a
 * different one is an error naming both; null or "auto" leaves the other's value. */
static void set_value_again(parse_ctx_t *ctx, int row, const char *name, const cJSON *v) {
    const config_key_t *k = &KEYS[row];
    dt_config_t *cfg = ctx->cfg;
    bool is_auto = cJSON_IsString(v) && !strcmp(v->valuestring, "auto");
    if (cJSON_IsNull(v) || is_auto || cfg->origin[row] == DT_CONFIG_ORIGIN_DEFAULT) {
        /* this one does not give a value, or the first did not: the given one stands */
        ctx->touched[row] = 0;
        if (!cJSON_IsNull(v) && !is_auto) set_value_as(ctx, row, name, v);
        ctx->touched[row] = 3;
        return;
    }
    unsigned char before[16], after[16];
    size_t n = field_size(k);
    memcpy(before, field(cfg, k), n);
    int errors = cfg->n_errors;
    ctx->touched[row] = 0;
    set_value_as(ctx, row, name, v);
    ctx->touched[row] = 3;
    memcpy(after, field(cfg, k), n);
    if (cfg->n_errors != errors || !memcmp(before, after, n)) return;
    memcpy(field(cfg, k), before, n);
    const char *alias = dt_config_key_alias_(k->path);
    bool first_is_key = strcmp(name, k->path) != 0; /* this one is the alias */
    char a[64], b[64];
    if (k->type == KT_INT && !(k->flags & KF_INT32)) {
        snprintf(a, sizeof a, "%lld", (long long)*(const int64_t *)(const void *)before);
        snprintf(b, sizeof b, "%lld", (long long)*(const int64_t *)(const void *)after);
    } else {
        snprintf(a, sizeof a, "(one value)");
        snprintf(b, sizeof b, "(another)");
    }
    add_error(cfg, ctx->src,
              "%s %s and %s %s: expected the same value (%s is DeepSpeed's name for %s); give one",
              k->path, first_is_key ? a : b, alias ? alias : name, first_is_key ? b : a,
              alias ? alias : name, k->path);
}

/* Sets key row from JSON value v given under name (the key's path, or an alias of
 * it, dt_config_alias_); reports its own errors naming it as given. */
static void set_value_as(parse_ctx_t *ctx, int row, const char *name, const cJSON *v) {
    const config_key_t *k = &KEYS[row];
    dt_config_t *cfg = ctx->cfg;
    void *f = field(cfg, k);
    unsigned char mark = strcmp(name, k->path) ? 2 : 1;

    if (ctx->origin != DT_CONFIG_ORIGIN_DEFAULT && ctx->touched[row]) {
        if (ctx->touched[row] & mark)
            add_error(cfg, ctx->src, "%s: expected the key once, found it given twice", name);
        else
            set_value_again(ctx, row, name, v);
        return;
    }
    ctx->touched[row] = mark;

    bool is_auto = cJSON_IsString(v) && !strcmp(v->valuestring, "auto");
    bool auto_is_name = false; /* device and comm.backend have a real "auto" */
    for (int i = 0; k->type == KT_ENUM && k->names[i]; i++)
        if (!strcmp(k->names[i], "auto")) auto_is_name = true;
    if (ctx->origin != DT_CONFIG_ORIGIN_DEFAULT &&
        (cJSON_IsNull(v) || (is_auto && k->type != KT_STRING && !auto_is_name))) {
        /* null or "auto": not given, the default (or derived value) applies */
        if (is_auto)
            dt_config_text_append_(&ctx->autos, "%s%s", ctx->autos.len ? ", " : "", k->path);
        const cJSON *d = cJSON_Parse(k->def);
        parse_ctx_t sub = {.cfg = cfg, .src = "default", .origin = DT_CONFIG_ORIGIN_DEFAULT};
        set_value(&sub, row, d);
        cJSON_Delete((cJSON *)d);
        cfg->origin[row] = DT_CONFIG_ORIGIN_DEFAULT;
        return;
    }
    if (is_auto && (k->flags & KF_PATH)) {
        type_error(ctx, k, name, v, " (dtrun cannot resolve \"auto\" for a path)");
        return;
    }

    switch (k->type) {
    case KT_BOOL:
        if (!cJSON_IsBool(v)) goto out_type_error;
        if (k->flags & KF_INT32) *(int *)f = cJSON_IsTrue(v); /* a model key: an int field */
        else *(bool *)f = cJSON_IsTrue(v);
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
        if ((k->flags & KF_SOURCES) && cJSON_IsArray(v)) {
            set_sources(ctx, k, v);
            return;
        }
        if ((k->flags & KF_LIST) && cJSON_IsArray(v)) { /* a list of names, kept as "a,b" */
            size_t len = 1;
            const cJSON *e;
            cJSON_ArrayForEach(e, v) {
                if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, ',')) goto out_type_error;
                len += strlen(e->valuestring) + 1;
            }
            if (len == 1) goto out_type_error;
            char *joined = dt_xcalloc(len, 1);
            cJSON_ArrayForEach(e, v) {
                if (joined[0]) strcat(joined, ",");
                strcat(joined, e->valuestring);
            }
            free(*s);
            *s = joined;
            break;
        }
        if (k->flags & KF_SOURCES) free_sources(cfg); /* a string replaces a list */
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
    cfg->origin[row] = ctx->origin;
    return;
out_type_error:
    type_error(ctx, k, name, v, NULL);
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
    int row = dt_config_key_find_(path);
    if (row >= 0) {
        set_value(ctx, row, v);
        return;
    }
    const char *key = dt_config_alias_(path);
    if (key && (row = dt_config_key_find_(key)) >= 0) {
        /* name: the alias as a static string (path is the caller's, freed after) */
        set_value_as(ctx, row, dt_config_key_alias_(key), v);
        return;
    }
    if (dt_config_is_section_(path)) {
        if (cJSON_IsObject(v))
            walk(ctx, v, path);
        else if (!cJSON_IsNull(v)) {
            char found[80];
            render(v, found, sizeof found);
            add_error(ctx->cfg, ctx->src, "%s: expected an object, found %s", path, found);
        }
        return;
    }
    if (dt_config_is_ignored_(path)) {
        dt_config_text_append_(&ctx->ignored, "%s%s", ctx->ignored.len ? ", " : "", path);
        return;
    }
    char best[256];
    if (dt_config_suggest_(path, best, sizeof best))
        add_error(ctx->cfg, ctx->src, "%s: unknown key (did you mean %s?)", path, best);
    else
        add_error(ctx->cfg, ctx->src, "%s: unknown key (dtrun config --keys lists them)", path);
}

/* ---- life cycle --------------------------------------------------------- */

static void derive(dt_config_t *cfg);

/* model.ops from model.type. */
static void sync_model(dt_config_t *cfg) { cfg->model.ops = dt_model_at(cfg->model_type); }

void dt_config_init(dt_config_t *cfg) {
    dt_config_keys_init_();
    memset(cfg, 0, sizeof *cfg);
    parse_ctx_t ctx = {.cfg = cfg, .src = "default", .origin = DT_CONFIG_ORIGIN_DEFAULT};
    for (int i = 0; i < N_KEYS; i++) {
        cJSON *d = cJSON_Parse(KEYS[i].def);
        set_value(&ctx, i, d); /* a bad default is a bug: test_config checks none fail */
        cJSON_Delete(d);
    }
    derive(cfg);
    sync_model(cfg);
    dt_config_errors_init_(cfg);
}

void dt_config_free(dt_config_t *cfg) {
    if (!cfg) return;
    for (int i = 0; i < N_KEYS; i++)
        if (KEYS[i].type == KT_STRING) free(*(char **)field(cfg, &KEYS[i]));
    free_sources(cfg);
    free(cfg->source);
    dt_config_errors_free_(cfg);
    memset(cfg, 0, sizeof *cfg);
}

const char *dt_config_errors(const dt_config_t *cfg) { return cfg->errors ? cfg->errors : ""; }
const char *dt_config_warnings(const dt_config_t *cfg) {
    return cfg->warnings ? cfg->warnings : "";
}

/* The strategy of a ZeRO stage: the current one when it is that stage (hsdp stays
 * hsdp at stage 3), else the table's first of the stage. */
static dt_strategy_t strategy_for_stage(int64_t stage, dt_strategy_t current) {
    if (dt_strategy_stage(current) == stage) return current;
    return dt_strategy_of_stage(stage);
}

int64_t dt_config_padded_vocab(int64_t vocab, int64_t multiple) {
    if (multiple <= 1) return vocab;
    return (vocab + multiple - 1) / multiple * multiple;
}

/* Keeps strategy and zero_optimization.stage the same thing after an override
 * touched one of them (the override sets both). */
static void sync_strategy_override(parse_ctx_t *ctx) {
    dt_config_t *cfg = ctx->cfg;
    int rs = dt_config_key_find_("strategy"), rz = dt_config_key_find_("zero_optimization.stage");
    if (ctx->touched[rs] && ctx->touched[rz]) {
        if (dt_strategy_stage(cfg->strategy) != cfg->zero.stage)
            add_error(cfg, ctx->src,
                      "strategy \"%s\" and zero_optimization.stage %lld: expected the same "
                      "thing (%s is stage %d)",
                      dt_config_strategy_name(cfg->strategy), (long long)cfg->zero.stage,
                      dt_config_strategy_name(cfg->strategy),
                      dt_strategy_stage(cfg->strategy));
    } else if (ctx->touched[rs] && cfg->origin[rs] == DT_CONFIG_ORIGIN_OVERRIDE) {
        cfg->zero.stage = dt_strategy_stage(cfg->strategy);
        cfg->origin[rz] = DT_CONFIG_ORIGIN_OVERRIDE;
    } else if (ctx->touched[rz] && cfg->origin[rz] == DT_CONFIG_ORIGIN_OVERRIDE) {
        cfg->strategy = strategy_for_stage(cfg->zero.stage, cfg->strategy);
        cfg->origin[rs] = DT_CONFIG_ORIGIN_OVERRIDE;
    }
}

/* Values that default to other keys' values. */
static void derive(dt_config_t *cfg) {
    if (cfg->origin[dt_config_key_find_("scheduler.params.warmup_max_lr")] == DT_CONFIG_ORIGIN_DEFAULT)
        cfg->scheduler.warmup_max_lr = cfg->optimizer.lr;
    if (cfg->origin[dt_config_key_find_("scheduler.params.total_num_steps")] == DT_CONFIG_ORIGIN_DEFAULT)
        cfg->scheduler.total_num_steps = cfg->train_steps;
}

/* tensor_parallel.* against the strategy and the model (the vocabulary rule only
 * when model.vocab_size is known: the launcher checks it again with the data's,
 * dt_config_tp_check_vocab). The world and node shapes: dt_config_resolve and
 * dt_config_check_nodes. */
static void check_tp(dt_config_t *cfg, const char *src) {
    if (cfg->tp.size <= 1) return;
    if (!dt_strategy_composes(cfg->strategy, DT_LAYOUT_TP))
        add_error(cfg, src,
                  "tensor_parallel.size %lld with strategy \"hsdp\": expected tensor_parallel.size 1 "
                  "(hsdp shards within a node, where a tensor-parallel group lives; use fsdp, "
                  "zero1, zero2 or ddp with it)",
                  (long long)cfg->tp.size);
    char msg[512];
    if (dt_config_tp_check_vocab(cfg, cfg->model.vocab_size, msg, sizeof msg)) add_error(cfg, src, "%s", msg);
}

/* pipeline.* against the strategy (the schedule against the micro-batches:
 * dt_config_resolve; the stages against the model's blocks: the launcher's checks,
 * runtime/train/train_check.c, once the model is built). */
static void check_pp(dt_config_t *cfg, const char *src) {
    if (cfg->pp.stages <= 1) { /* chunks per rank of a pipeline that is off would be ignored */
        if (cfg->pp.virtual_stages > 1)
            add_error(cfg, src, "pipeline.virtual_stages %lld: expected 1 without a pipeline (pipeline.stages is 1; "
                                "virtual stages are chunks per pipeline rank)",
                      (long long)cfg->pp.virtual_stages);
        return;
    }
    if (!dt_strategy_composes(cfg->strategy, DT_LAYOUT_PP))
        add_error(cfg, src,
                  "pipeline.stages %lld with strategy \"hsdp\": expected pipeline.stages 1 (hsdp's shard group is "
                  "a node's ranks, which pipeline stages cut across; use fsdp, zero1, zero2 or ddp with it)",
                  (long long)cfg->pp.stages);
    if (cfg->model.ops && !cfg->model.ops->pipeline)
        add_error(cfg, src, "pipeline.stages %lld: model.type \"%s\" has no pipeline stages (gpt and llama have)",
                  (long long)cfg->pp.stages, cfg->model.ops->name);
}

/* context_parallel.* against the model, the sequence and the strategy (the world:
 * dt_config_resolve). */
static void check_cp(dt_config_t *cfg, const char *src) {
    long long C = (long long)cfg->cp.size;
    if (C <= 1) return;
    if (cfg->model.ops->data != DT_MODEL_DATA_TOKENS || !cfg->model.ops->pipeline)
        add_error(cfg, src, "context_parallel.size %lld: model.type \"%s\" has no context parallelism (gpt and "
                            "llama have)", C, cfg->model.ops->name);
    else if (cfg->model.seq_len % (2 * C) != 0)
        add_error(cfg, src,
                  "context_parallel.size %lld: model.seq_len %d is not a multiple of 2 x %lld = %lld (each rank "
                  "holds 2 of the sequence's 2 x context_parallel.size equal chunks)",
                  C, cfg->model.seq_len, C, 2 * C);
    if (!dt_strategy_composes(cfg->strategy, DT_LAYOUT_CP))
        add_error(cfg, src,
                  "context_parallel.size %lld with strategy \"hsdp\": expected context_parallel.size 1 (hsdp's "
                  "shard group is a node's ranks; use fsdp, zero1, zero2 or ddp with it)", C);
    const dt_model_ops *mo = cfg->model.ops;
    if (cfg->cp.mode == DT_CONFIG_CP_ULYSSES && mo && mo->heads) {
        int nh = 0, nkv = 0;
        mo->heads(&cfg->model, &nh, &nkv);
        long long tp = cfg->tp.size > 1 ? (long long)cfg->tp.size : 1;
        if (nh % (tp * C) || nkv % (tp * C))
            add_error(cfg, src,
                      "context_parallel.mode \"ulysses\" at context_parallel.size %lld: the model's %d query and %d "
                      "key/value heads must divide by tensor_parallel.size x context_parallel.size = %lld (use "
                      "context_parallel.mode \"ring\")", C, nh, nkv, tp * C);
    }
}

/* Rules across keys, once the file and the overrides are in. */
static void finish(dt_config_t *cfg, const char *src) {
    int rs = dt_config_key_find_("strategy"), rz = dt_config_key_find_("zero_optimization.stage");
    if (cfg->origin[rs] == DT_CONFIG_ORIGIN_FILE && cfg->origin[rz] == DT_CONFIG_ORIGIN_FILE) {
        if (dt_strategy_stage(cfg->strategy) != cfg->zero.stage)
            add_error(cfg, src,
                      "strategy \"%s\" and zero_optimization.stage %lld: expected the same "
                      "thing (%s is stage %d); give one, or override either on the command "
                      "line",
                      dt_config_strategy_name(cfg->strategy), (long long)cfg->zero.stage,
                      dt_config_strategy_name(cfg->strategy),
                      dt_strategy_stage(cfg->strategy));
    } else if (cfg->origin[rs] == DT_CONFIG_ORIGIN_FILE) {
        cfg->zero.stage = dt_strategy_stage(cfg->strategy);
    } else if (cfg->origin[rz] == DT_CONFIG_ORIGIN_FILE) {
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

    dt_config_apply_pretrained_(cfg, src);
    sync_model(cfg);
    char msg[512];
    if (cfg->model.ops->config_check && cfg->model.ops->config_check(&cfg->model, msg, sizeof msg))
        add_error(cfg, src, "%s", msg);
    check_tp(cfg, src);
    check_pp(cfg, src);
    check_cp(cfg, src);
    dt_config_recompute_finish_(cfg, src);
    if (cfg->model.ops->data == DT_MODEL_DATA_TOKENS) {
        if (!cfg->data.train && cfg->data.n_sources == 0)
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

static void flush_notes(parse_ctx_t *ctx) {
    /* an override names itself as the user wrote it: "KEY=VALUE (from the command line)" */
    int cli = ctx->origin == DT_CONFIG_ORIGIN_OVERRIDE && !strncmp(ctx->src, "override ", 9);
    const char *src = cli ? ctx->src + 9 : ctx->src, *from = cli ? " (from the command line)" : "";
    if (ctx->ignored.len)
        add_warning(ctx->cfg, "%s%s: ignoring DeepSpeed keys that dtrun does not implement: %s", src, from,
                    ctx->ignored.s);
    if (ctx->autos.len)
        add_warning(ctx->cfg, "%s%s: \"auto\" resolved to dtrun's default or derived value for: %s", src, from,
                    ctx->autos.s);
    free(ctx->ignored.s);
    free(ctx->autos.s);
    ctx->ignored = (dt_config_text){0};
    ctx->autos = (dt_config_text){0};
}

static int log_warnings = 1;
void dt_config_log_warnings(int on) { log_warnings = on; }

/* Applies one "KEY=VALUE"; errors are recorded on cfg. */
static void apply_override(dt_config_t *cfg, const char *kv) {
    size_t n = strlen("override ") + strlen(kv) + 1;
    char *src = dt_xmalloc(n);
    snprintf(src, n, "override %s", kv);
    parse_ctx_t ctx = {.cfg = cfg, .src = src, .origin = DT_CONFIG_ORIGIN_OVERRIDE};
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
    int row = dt_config_key_find_(key);
    cJSON *v = cJSON_ParseWithOpts(text, NULL, 1);
    /* a string or enum key takes the text as it is, unless it is a quoted JSON string
     * (or null); other keys take it as a string when it is not JSON */
    bool raw = !v || (row >= 0 && (KEYS[row].type == KT_STRING || KEYS[row].type == KT_ENUM) &&
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

static dt_status_t load_text(const char *json, const char *name, const char *const *overrides,
                             int n_overrides, dt_config_t *cfg) {
    parse_ctx_t ctx = {.cfg = cfg, .src = name, .origin = DT_CONFIG_ORIGIN_FILE};
    if (json) {
        const char *end = NULL;
        cJSON *root = cJSON_ParseWithOpts(json, &end, 1);
        if (!root) {
            dt_config_json_error_(cfg, name, json, end);
        } else if (!cJSON_IsObject(root)) {
            char found[80];
            render(root, found, sizeof found);
            add_error(cfg, name, "expected a JSON object at the top, found %s", found);
        } else {
            walk(&ctx, root, "");
            bool has_model = false;
            for (int i = 0; i < N_KEYS; i++)
                if (!strncmp(KEYS[i].path, "model.", 6) && cfg->origin[i] != DT_CONFIG_ORIGIN_DEFAULT) has_model = true;
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
    int rts = dt_config_key_find_("train_steps"), rtot = dt_config_key_find_("scheduler.params.total_num_steps");
    int64_t file_steps = cfg->train_steps, file_total = cfg->scheduler.total_num_steps;
    for (int i = 0; i < n_overrides; i++) {
        if (!overrides[i]) continue;
        apply_override(cfg, overrides[i]);
    }
    /* train_steps=N on the command line over a file whose schedule spans its own
     * train_steps: the schedule follows (it used to keep the file's length silently) */
    if (cfg->origin[rts] == DT_CONFIG_ORIGIN_OVERRIDE && cfg->origin[rtot] == DT_CONFIG_ORIGIN_FILE &&
        cfg->train_steps != file_steps && cfg->scheduler.type != DT_SCHED_NONE) {
        if (file_total == file_steps) {
            cfg->scheduler.total_num_steps = cfg->train_steps;
            add_warning(cfg, "train_steps=%lld from the command line: scheduler.params.total_num_steps follows it "
                        "(%lld; %s gives both as %lld)", (long long)cfg->train_steps, (long long)cfg->train_steps,
                        name, (long long)file_steps);
        } else {
            add_warning(cfg, "train_steps=%lld from the command line, but scheduler.params.total_num_steps is %lld "
                        "(from %s): the learning-rate schedule keeps that length (give "
                        "scheduler.params.total_num_steps=%lld to tie them)", (long long)cfg->train_steps,
                        (long long)file_total, name, (long long)cfg->train_steps);
        }
    }
    finish(cfg, name);
    dt_config_errors_keep_(cfg);
    if (cfg->warnings_len && log_warnings) {
        /* the warnings once, line by line */
        char *copy = dt_xstrdup(cfg->warnings);
        for (char *save = NULL, *l = strtok_r(copy, "\n", &save); l;
             l = strtok_r(NULL, "\n", &save))
            DT_LOG_WARN("%s", l);
        free(copy);
    }
    return dt_config_errors_status_(cfg);
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
    char shown[1024]; /* the name messages print: its control characters escaped */
    cfg->source = dt_xstrdup(path ? dt_fs_printable(path, shown, sizeof shown) : "(no file)");
    if (!path) return load_text(NULL, cfg->source, overrides, n_overrides, cfg);
    size_t len = 0;
    char *text = NULL;
    /* a config is small; a disk image, a FIFO or a directory is refused unread */
    if (dt_fs_read_file(path, (size_t)64 << 20, &text, &len) != DT_STATUS_OK) {
        const char *why = dt_error_detail();
        size_t n = strlen(cfg->source); /* the message already starts with the file's name */
        if (!strncmp(why, cfg->source, n) && !strncmp(why + n, ": ", 2)) why += n + 2;
        add_error(cfg, cfg->source, "expected a readable JSON file, found an error: %s", why);
        dt_config_errors_keep_(cfg);
        return dt_config_errors_status_(cfg);
    }
    if (strlen(text) != len) {
        add_error(cfg, cfg->source, "expected a JSON text file, found a NUL byte at offset %zu",
                  strlen(text));
        free(text);
        dt_config_errors_keep_(cfg);
        return dt_config_errors_status_(cfg);
    }
    dt_status_t st = load_text(text, cfg->source, overrides, n_overrides, cfg);
    free(text);
    return st;
}

dt_status_t dt_config_set(dt_config_t *cfg, const char *key_eq_value) {
    dt_config_errors_rewind_(cfg);
    apply_override(cfg, key_eq_value ? key_eq_value : "");
    finish(cfg, cfg->source ? cfg->source : "config");
    dt_config_errors_keep_(cfg);
    return dt_config_errors_status_(cfg);
}

/* Sets integer key row as a KEY=VALUE override would (the same checks against the
 * row, the same messages, named "override KEY=VALUE"), without the text. */
static void set_override_int(dt_config_t *cfg, const char *key, int64_t value) {
    char src[160];
    snprintf(src, sizeof src, "override %s=%lld", key, (long long)value);
    parse_ctx_t ctx = {.cfg = cfg, .src = src, .origin = DT_CONFIG_ORIGIN_OVERRIDE};
    cJSON *v = cJSON_CreateNumber((double)value);
    set_value(&ctx, dt_config_key_find_(key), v);
    cJSON_Delete(v);
}

dt_status_t dt_config_set_batch(dt_config_t *cfg, int64_t train_batch_size, int64_t micro_batch, int64_t accumulation) {
    static const char *const keys[] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                       "gradient_accumulation_steps"};
    const int64_t values[] = {train_batch_size, micro_batch, accumulation};
    dt_config_errors_rewind_(cfg);
    for (int i = 0; i < 3; i++) {
        set_override_int(cfg, keys[i], values[i]);
        if (cfg->n_errors) break;
    }
    dt_config_errors_keep_(cfg);
    return dt_config_errors_status_(cfg);
}
