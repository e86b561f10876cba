/*
 * train_ckpt.c - the trainer's state in and out of checkpoints, preemption and
 * fault injection (see train_ckpt.h).
 */
#include "runtime/train/train_ckpt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/trace.h" /* defines: dt_trace_span */
#include "common/rng.h" /* defines: dt_random_bytes */
#include "common/clock.h"
#include "common/fs.h"      /* defines: dt_fs_mkdir_p, dt_fs_printable */
#include "common/fs_safe.h"
#include "common/torchenv.h" /* defines: DT_STOP_GROUP_FAILURE */
#include "common/log.h"
#include "common/mem.h"
#include "runtime/train/metrics.h"

int dt_train_ckpt_enabled(const dt_config_t *cfg) {
    return cfg->checkpoint.every_steps > 0 && cfg->checkpoint.dir && *cfg->checkpoint.dir;
}

/* The ranges this rank owns; replicated buffers: an even slice per rank. */
static dt_train_ckpt_owned *owned_ranges(const dt_train_ckpt *t, int *n) {
    if (t->n_owned < 0) { /* owns nothing */
        *n = 0;
        return dt_xcalloc(1, sizeof(dt_train_ckpt_owned));
    }
    if (t->n_owned > 0) {
        dt_train_ckpt_owned *o = dt_xcalloc((size_t)t->n_owned, sizeof *o);
        memcpy(o, t->owned, (size_t)t->n_owned * sizeof *o);
        *n = t->n_owned;
        return o;
    }
    uint64_t total = t->layout->n_params, per = (total + (uint64_t)t->world_size - 1) / (uint64_t)t->world_size;
    uint64_t lo = per * (uint64_t)t->rank, hi = lo + per < total ? lo + per : total;
    dt_train_ckpt_owned *o = dt_xcalloc(1, sizeof *o);
    *n = 0;
    if (lo >= hi) return o;
    size_t es = dt_dtype_size(t->dev->ops->dtype);
    o->offset = lo;
    o->count = hi - lo;
    o->params = (char *)t->params + lo * es;
    o->m = t->m + lo;
    o->v = t->v + lo;
    *n = 1;
    return o;
}

/* Device buffers are host fp32 on the CPU backend, and so is an offloaded optimizer's
 * state: read and written in place. */
static int host_state(const dt_train_ckpt *t) {
    return t->state_host || (t->dev->kind == DT_DEVICE_CPU && t->dev->ops->dtype == DT_DTYPE_F32);
}

/* Params of a range: fp32 masters, or device tensors of the compute dtype. */
static int params_are_f32(const dt_train_ckpt *t) { return t->params_fp32 || t->dev->ops->dtype == DT_DTYPE_F32; }

static char *extra_json(const dt_train_ckpt *t, int64_t step, const char *why) {
    cJSON *o = cJSON_CreateObject();
    char *dump = dt_config_dump_json(t->cfg);
    cJSON *cfg = dump ? cJSON_Parse(dump) : NULL;
    free(dump);
    if (cfg) cJSON_AddItemToObject(o, "config", cfg);
    cJSON_AddStringToObject(o, "reason", why);
    cJSON_AddStringToObject(o, "compute_dtype", dt_dtype_name(t->dev->ops->dtype)); /* export's default dtype */
    if (t->data) {
        dt_data_pos p = dt_data_get_pos(t->data);
        cJSON *d = cJSON_AddObjectToObject(o, "data");
        cJSON_AddNumberToObject(d, "epoch", (double)p.epoch);
        cJSON_AddNumberToObject(d, "cursor", (double)p.cursor);
        cJSON_AddNumberToObject(d, "samples", (double)p.samples);
        cJSON *srcs = cJSON_AddArrayToObject(d, "sources");
        for (int i = 0; i < p.n_sources; i++) {
            cJSON *s = cJSON_CreateObject();
            cJSON_AddStringToObject(s, "path", dt_data_source_path(t->data, i));
            cJSON_AddNumberToObject(s, "epoch", (double)p.src[i].epoch);
            cJSON_AddNumberToObject(s, "cursor", (double)p.src[i].cursor);
            cJSON_AddItemToArray(srcs, s);
        }
    }
    if (t->mlp_cursor) {
        cJSON *d = cJSON_AddObjectToObject(o, "mlp_data");
        cJSON_AddNumberToObject(d, "cursor", (double)*t->mlp_cursor);
    }
    cJSON *r = cJSON_AddObjectToObject(o, "rng");
    cJSON_AddNumberToObject(r, "seed", (double)t->cfg->seed);
    if (t->rng) {
        cJSON *s = cJSON_AddArrayToObject(r, "state");
        for (int i = 0; i < 4; i++) {
            char hex[24];
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)t->rng->s[i]);
            cJSON_AddItemToArray(s, cJSON_CreateString(hex));
        }
    }
    cJSON *s = cJSON_AddObjectToObject(o, "scheduler");
    cJSON_AddNumberToObject(s, "last_batch_iteration", (double)(step - 1));
    cJSON_AddNumberToObject(s, "step", (double)step);
    cJSON *a = cJSON_AddObjectToObject(o, "optimizer");
    cJSON_AddStringToObject(a, "type", "AdamW");
    cJSON_AddNumberToObject(a, "adam_step", (double)step);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* The checkpoint holds the whole model's layout: a tensor-parallel rank's local
 * ranges become pieces of the global tensors (dt_model_tp_segments), runs of equal
 * pieces at a constant distance one strided range (a row-parallel weight's columns
 * of every row), and the tensors every TP rank holds whole are written by TP rank 0
 * only. */
static const dt_model_layout *global_layout(const dt_train_ckpt *t) {
    return t->layout->global ? t->layout->global : t->layout;
}

typedef struct piece_list {
    dt_ckpt_range *r;
    int n, cap;
    const char *buffer;
    const float *data;   /* host data of the local range */
    size_t local0;       /* its local offset */
    int skip_replicated; /* TP ranks but 0 */
} piece_list;

static void add_piece(void *ctx, size_t local, size_t global, size_t n, int replicated) {
    piece_list *p = ctx;
    if (replicated && p->skip_replicated) return;
    const float *d = p->data + (local - p->local0);
    dt_ckpt_range *last = p->n ? &p->r[p->n - 1] : NULL;
    if (last && last->buffer == p->buffer && last->count == n) {
        uint64_t reps = last->reps ? last->reps : 1;
        uint64_t stride = reps > 1 ? last->stride : global - last->offset;
        const float *end = last->data + reps * last->count; /* pieces are consecutive in data */
        if (d == end && stride >= n && global == last->offset + reps * stride) {
            last->stride = stride;
            last->reps = reps + 1;
            return;
        }
    }
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 16;
        p->r = dt_xrealloc(p->r, (size_t)p->cap * sizeof *p->r);
    }
    p->r[p->n++] = (dt_ckpt_range){.buffer = p->buffer, .offset = global, .count = n, .data = d};
}

uint64_t dt_train_ckpt_stage_elems(const dt_train_ckpt *t) {
    int n = 0;
    dt_train_ckpt_owned *own = owned_ranges(t, &n);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) total += 3 * own[i].count;
    free(own);
    return total;
}

void dt_train_ckpt_shard_free(dt_train_ckpt_shard *s) {
    for (int i = 0; i < s->n_staged; i++) dt_mem_free(s->staged[i]);
    free(s->staged);
    free(s->ranges);
    free(s->extra);
    memset(s, 0, sizeof *s);
}

dt_status_t dt_train_ckpt_stage(const dt_train_ckpt *t, int64_t step, const char *why, float *arena,
                                 dt_train_ckpt_shard *out) {
    const dt_ops_t *ops = t->dev->ops;
    memset(out, 0, sizeof *out);
    int n = 0;
    dt_train_ckpt_owned *own = owned_ranges(t, &n);
    dt_ckpt_range *ranges = dt_xcalloc((size_t)(3 * n + 1), sizeof *ranges);
    out->staged = dt_xcalloc((size_t)(3 * n + 1), sizeof *out->staged);
    out->n_staged = 3 * n;
    dt_status_t st = DT_STATUS_OK;
    double t0 = dt_now_s();
    DT_CHECK_GOTO(ops->synchronize(t->dev), st, out_free);
    for (int i = 0; i < n; i++) {
        const void *src[3] = {own[i].params, own[i].m, own[i].v};
        static const char *names[3] = {"params", "m", "v"};
        for (int b = 0; b < 3; b++) {
            dt_ckpt_range *r = &ranges[3 * i + b];
            r->buffer = names[b];
            r->offset = own[i].offset;
            r->count = own[i].count;
            size_t bytes = own[i].count * sizeof(float);
            if (host_state(t) && !arena) { /* written from where it lives */
                r->data = src[b];
                continue;
            }
            float *h = arena;
            if (arena) arena += own[i].count;
            else h = out->staged[3 * i + b] = dt_mem_alloc(DT_MEM_OTHER, bytes);
            if (!h) {
                st = DT_STATUS_NOMEM;
                goto out_free;
            }
            if (host_state(t)) memcpy(h, src[b], bytes); /* a snapshot the next step cannot change */
            else if (b == 0 && !params_are_f32(t))
                DT_CHECK_GOTO(ops->download_f32(t->dev, h, src[b], own[i].count), st, out_free);
            else DT_CHECK_GOTO(ops->copy(t->dev, h, src[b], bytes, DT_COPY_DEVICE_TO_HOST), st, out_free);
            r->data = h;
        }
    }
    if (!host_state(t) || arena) DT_CHECK_GOTO(ops->synchronize(t->dev), st, out_free);
    out->stage_s = dt_now_s() - t0;
    dt_trace_span(DT_TRACE_CKPT, "stage", t0, t0 + out->stage_s);
    int n_ranges = 3 * n;
    if (t->layout->global) { /* a TP piece: its ranges as pieces of the global tensors */
        piece_list pl = {.skip_replicated = t->layout->tp_rank != 0};
        for (int i = 0; i < 3 * n; i++) {
            pl.buffer = ranges[i].buffer;
            pl.data = ranges[i].data;
            pl.local0 = ranges[i].offset;
            dt_model_tp_segments(t->layout, ranges[i].offset, ranges[i].count, add_piece, &pl);
        }
        free(ranges);
        ranges = pl.r;
        n_ranges = pl.n;
    }
    if (t->rank == 0) out->extra = extra_json(t, step, why);
    out->ranges = ranges;
    out->n_ranges = n_ranges;
    ranges = NULL;
    out->args = (dt_ckpt_save_args){.dir = t->cfg->checkpoint.dir, .step = step, .rank = t->rank,
                                    .world_size = t->world_size, .strategy = dt_config_strategy_name(t->cfg->strategy),
                                    .layout = global_layout(t), .ranges = out->ranges, .n_ranges = n_ranges,
                                    .extra_json = out->extra, .keep_last = t->cfg->checkpoint.keep_last,
                                    .run_id = t->run_id, .barrier = t->barrier, .barrier_ctx = t->barrier_ctx};
out_free:
    free(ranges);
    free(own);
    if (st != DT_STATUS_OK) dt_train_ckpt_shard_free(out);
    return st;
}

void dt_train_ckpt_log_saved(const dt_train_ckpt *t, int64_t step, const char *why, const dt_ckpt_save_stats *stats,
                             double total_s, double stage_s) {
    if (t->rank != 0) return;
    double all = 3.0 * 4.0 * (double)global_layout(t)->n_params;
    DT_LOG_INFO("checkpoint: step %lld (%s) saved to %s in %.3f s: %.1f MB in all, %.1f MB from this rank in "
                "%.3f s (%.2f GB/s), staging %.3f s",
                (long long)step, why, stats->path, total_s, all / 1e6, (double)stats->shard_bytes / 1e6,
                stats->write_s, stats->write_s > 0 ? (double)stats->shard_bytes / stats->write_s / 1e9 : 0.0,
                stage_s);
}

dt_status_t dt_train_ckpt_save(const dt_train_ckpt *t, int64_t step, const char *why) {
    double t0 = dt_now_s();
    dt_train_ckpt_shard s;
    DT_CHECK(dt_train_ckpt_stage(t, step, why, NULL, &s));
    dt_ckpt_save_stats stats;
    double w0 = dt_trace_now();
    dt_status_t st = dt_ckpt_save(&s.args, &stats);
    dt_trace_end(DT_TRACE_CKPT, "write", w0);
    dt_trace_end(DT_TRACE_CKPT, "save", t0);
    if (st != DT_STATUS_OK) {
        char detail[1024]; /* dt_error writes the buffer dt_error_detail reads */
        snprintf(detail, sizeof detail, "%s", dt_error_detail());
        st = dt_error(st, "checkpoint of step %lld (%s) failed: %s", (long long)step, why, detail);
    } else {
        dt_train_ckpt_log_saved(t, step, why, &stats, dt_now_s() - t0, s.stage_s);
    }
    dt_train_ckpt_shard_free(&s);
    return st;
}

/* Member key of o (o may be NULL) as a count in [0, 2^53]: an error naming
 * meta.json, the field and its value otherwise (checkpoint.h). */
static dt_status_t meta_count(const dt_ckpt_t *c, const cJSON *o, const char *key, const char *field, uint64_t *out) {
    char mpath[PATH_MAX + 16];
    snprintf(mpath, sizeof mpath, "%s/meta.json", dt_ckpt_path(c));
    return dt_ckpt_meta_uint(cJSON_GetObjectItemCaseSensitive(o, key), 0, DT_CKPT_META_INT_MAX, mpath, field, out);
}

typedef struct read_ctx {
    dt_ckpt_t *c;
    const char *buffer;
} read_ctx;

static dt_status_t read_global(void *ctx, size_t goffset, size_t n, float *dst) {
    read_ctx *r = ctx;
    return dt_ckpt_read(r->c, r->buffer, goffset, n, dst);
}

/* Local elements [offset, offset + count) of a buffer: the range itself, or a TP
 * piece's parts of the global tensors. */
static dt_status_t read_local(const dt_train_ckpt *t, dt_ckpt_t *c, const char *buffer, uint64_t offset,
                              uint64_t count, float *dst) {
    read_ctx r = {c, buffer};
    return dt_model_tp_fill(t->layout, offset, count, dst, read_global, &r);
}

dt_status_t dt_train_ckpt_read_range(const dt_train_ckpt *t, dt_ckpt_t *c, uint64_t offset, uint64_t count,
                                     void *params, float *m, float *v) {
    const dt_ops_t *ops = t->dev->ops;
    void *dst[3] = {params, m, v};
    static const char *names[3] = {"params", "m", "v"};
    if (host_state(t)) {
        for (int b = 0; b < 3; b++)
            if (dst[b]) DT_CHECK(read_local(t, c, names[b], offset, count, dst[b]));
        return DT_STATUS_OK;
    }
    float *h = dt_mem_alloc(DT_MEM_OTHER, count * sizeof(float));
    if (!h) return DT_STATUS_NOMEM;
    dt_status_t st = DT_STATUS_OK;
    for (int b = 0; b < 3 && st == DT_STATUS_OK; b++) {
        if (!dst[b]) continue;
        st = read_local(t, c, names[b], offset, count, h);
        if (st != DT_STATUS_OK) break;
        if (b == 0 && !params_are_f32(t)) st = ops->upload_f32(t->dev, dst[b], h, count);
        else st = ops->copy(t->dev, dst[b], h, count * sizeof(float), DT_COPY_HOST_TO_DEVICE);
    }
    if (st == DT_STATUS_OK) st = ops->synchronize(t->dev);
    dt_mem_free(h);
    return st;
}

/* Reads what this rank holds: replicas the whole buffers; owned ranges their
 * slices (and, with load_full_params, every parameter); or the caller's loader. */
static dt_status_t load_buffers(const dt_train_ckpt *t, dt_ckpt_t *c) {
    if (t->load) return t->load(t->load_ctx, c);
    if (t->n_owned == 0)
        return dt_train_ckpt_read_range(t, c, 0, t->layout->n_params, t->params, t->m, t->v);
    for (int i = 0; i < t->n_owned; i++) {
        const dt_train_ckpt_owned *o = &t->owned[i];
        DT_CHECK(dt_train_ckpt_read_range(t, c, o->offset, o->count, t->load_full_params ? NULL : o->params, o->m, o->v));
    }
    if (t->load_full_params) DT_CHECK(dt_train_ckpt_read_range(t, c, 0, t->layout->n_params, t->params, NULL, NULL));
    return DT_STATUS_OK;
}

/* data.sources of meta.json (absent in checkpoints from before mixtures: pos keeps
 * n_sources 0 and source 0 resumes from data.epoch/cursor). */
static dt_status_t read_sources(dt_ckpt_t *c, const cJSON *d, dt_data_pos *pos) {
    const cJSON *srcs = cJSON_GetObjectItemCaseSensitive(d, "sources");
    if (!srcs) return DT_STATUS_OK;
    int n = cJSON_GetArraySize(srcs);
    if (!cJSON_IsArray(srcs) || n < 1 || n > DT_DATA_MAX_SOURCES)
        return dt_error(DT_STATUS_FORMAT, "%s/meta.json: data.sources: expected a list of 1 to %d positions",
                        dt_ckpt_path(c), DT_DATA_MAX_SOURCES);
    DT_CHECK(meta_count(c, d, "samples", "data.samples", &pos->samples));
    char field[64];
    for (int i = 0; i < n; i++) {
        const cJSON *s = cJSON_GetArrayItem(srcs, i);
        snprintf(field, sizeof field, "data.sources[%d].epoch", i);
        DT_CHECK(meta_count(c, s, "epoch", field, &pos->src[i].epoch));
        snprintf(field, sizeof field, "data.sources[%d].cursor", i);
        DT_CHECK(meta_count(c, s, "cursor", field, &pos->src[i].cursor));
    }
    pos->n_sources = n;
    return DT_STATUS_OK;
}

/* Opens, checks and loads one checkpoint. *touched is set once device buffers
 * may have been overwritten. */
static dt_status_t load_one(const dt_train_ckpt *t, const char *path, int64_t *step, int *touched) {
    dt_ckpt_t *c;
    double t0 = dt_now_s();
    DT_CHECK(dt_ckpt_open(path, &c));
    dt_status_t st = DT_STATUS_OK;
    const cJSON *meta = dt_ckpt_meta(c);
    dt_data_pos pos = {0};
    uint64_t mlp = 0;
    DT_CHECK_GOTO(dt_ckpt_check_layout(c, global_layout(t)), st, out_close);
    if (t->data) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(meta, "data");
        DT_CHECK_GOTO(meta_count(c, d, "epoch", "data.epoch", &pos.epoch), st, out_close);
        DT_CHECK_GOTO(meta_count(c, d, "cursor", "data.cursor", &pos.cursor), st, out_close);
        DT_CHECK_GOTO(read_sources(c, d, &pos), st, out_close);
        int n = dt_data_n_sources(t->data);
        if (pos.n_sources ? pos.n_sources != n : n != 1) {
            st = dt_error(DT_STATUS_FORMAT, "%s/meta.json: the data position has %d source(s) but data.train has %d "
                          "(resume with the same data.train sources)", dt_ckpt_path(c), pos.n_sources ? pos.n_sources : 1, n);
            goto out_close;
        }
    }
    if (t->mlp_cursor)
        DT_CHECK_GOTO(meta_count(c, cJSON_GetObjectItemCaseSensitive(meta, "mlp_data"), "cursor", "mlp_data.cursor", &mlp),
                      st, out_close);
    dt_rng rng = {{0}};
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(meta, "rng"), "state");
    if (t->rng) {
        if (cJSON_GetArraySize(rs) != 4) {
            st = dt_error(DT_STATUS_FORMAT, "%s/meta.json: no rng.state of 4 words", dt_ckpt_path(c));
            goto out_close;
        }
        for (int i = 0; i < 4; i++) {
            const cJSON *w = cJSON_GetArrayItem(rs, i);
            size_t len = cJSON_IsString(w) ? strlen(w->valuestring) : 0;
            if (len < 1 || len > 16 || strspn(w->valuestring, "0123456789abcdefABCDEF") != len) {
                st = dt_error(DT_STATUS_FORMAT, "%s/meta.json: rng.state[%d] is not a hex string of 1 to 16 digits",
                              dt_ckpt_path(c), i);
                goto out_close;
            }
            rng.s[i] = strtoull(w->valuestring, NULL, 16);
        }
    }
    *touched = 1;
    DT_CHECK_GOTO(load_buffers(t, c), st, out_close);
    if (t->data) DT_CHECK_GOTO(dt_data_set_pos(t->data, pos), st, out_close); /* counts checked above */
    if (t->mlp_cursor) *t->mlp_cursor = mlp;
    if (t->rng) *t->rng = rng;
    *step = dt_ckpt_step(c);
    if (t->run_id) snprintf(t->run_id, DT_TRAIN_RUN_ID_LEN, "%s", dt_ckpt_run_id(c)); /* the run continues */
    double s = dt_now_s() - t0;
    if (t->rank == 0)
        DT_LOG_INFO("checkpoint: resumed from %s (step %lld, saved by %d rank(s) with %s): read %.1f MB in %.3f s "
                    "(%.2f GB/s)",
                    dt_ckpt_path(c), (long long)*step, dt_ckpt_world_size(c), dt_ckpt_strategy(c),
                    (double)dt_ckpt_bytes_read(c) / 1e6, s, s > 0 ? (double)dt_ckpt_bytes_read(c) / s / 1e9 : 0.0);
out_close:
    dt_ckpt_close(c);
    return st;
}

/* Uploads the initial parameters of [offset, offset + count) to dst (fp32 masters
 * when fp32, else the compute dtype) in bounded host chunks: no rank builds the
 * whole buffer. */
static dt_status_t upload_init(const dt_train_ckpt *t, size_t offset, size_t count, void *dst, int fp32) {
    const dt_ops_t *ops = t->dev->ops;
    size_t chunk = count < ((size_t)1 << 22) ? count : ((size_t)1 << 22);
    size_t es = fp32 ? sizeof(float) : dt_dtype_size(ops->dtype);
    float *h = dt_mem_alloc(DT_MEM_OTHER, (chunk ? chunk : 1) * sizeof(float));
    if (!h) return DT_STATUS_NOMEM;
    dt_status_t st = DT_STATUS_OK;
    for (size_t k = 0; k < count && st == DT_STATUS_OK; k += chunk) {
        size_t c = count - k < chunk ? count - k : chunk;
        dt_model_init_range(t->layout, (uint64_t)t->cfg->seed, offset + k, c, h);
        void *d = (char *)dst + k * es;
        st = fp32 ? ops->copy(t->dev, d, h, c * sizeof(float), DT_COPY_HOST_TO_DEVICE)
                            : ops->upload_f32(t->dev, d, h, c);
        if (st == DT_STATUS_OK) st = ops->synchronize(t->dev);
    }
    dt_mem_free(h);
    return st;
}

/* Puts freshly initialised parameters and zero moments back (a failed load may
 * have overwritten part of them). */
static dt_status_t reinit(const dt_train_ckpt *t) {
    size_t n = t->layout->n_params;
    int k = 0;
    dt_train_ckpt_owned *own = owned_ranges(t, &k);
    if (t->n_owned == 0) {
        own = dt_xrealloc(own, sizeof *own);
        own[0] = (dt_train_ckpt_owned){0, n, t->params, t->m, t->v};
        k = 1;
    }
    const dt_ops_t *ops = t->dev->ops;
    dt_status_t st = DT_STATUS_OK;
    for (int i = 0; i < k && st == DT_STATUS_OK; i++) {
        st = upload_init(t, own[i].offset, own[i].count, own[i].params, t->params_fp32);
        if (st == DT_STATUS_OK) st = ops->set(t->dev, own[i].m, 0, own[i].count * sizeof(float));
        if (st == DT_STATUS_OK) st = ops->set(t->dev, own[i].v, 0, own[i].count * sizeof(float));
    }
    if (st == DT_STATUS_OK && t->n_owned > 0 && t->load_full_params) st = upload_init(t, 0, n, t->params, 0);
    free(own);
    return st;
}

/* The launch's id when the launcher gave one (DTRUN_LAUNCH_ID: the same on every rank
 * and node, and across the restarts of one launch), else 16 hex digits from the
 * kernel's random source (time and pid without it). */
static void new_run_id(char *out) {
    const char *l = getenv("DTRUN_LAUNCH_ID");
    if (l && strlen(l) == 16 && strspn(l, "0123456789abcdef") == 16) {
        snprintf(out, DT_TRAIN_RUN_ID_LEN, "%s", l);
        return;
    }
    uint64_t x = 0;
    if (dt_random_bytes(&x, sizeof x) != DT_STATUS_OK) x = (uint64_t)(dt_wall_s() * 1e6) ^ ((uint64_t)getpid() << 40);
    snprintf(out, DT_TRAIN_RUN_ID_LEN, "%016llx", (unsigned long long)x);
}

void dt_train_resume_init_(dt_train_resume *r) { *r = (dt_train_resume){0}; }

void dt_train_resume_note_checkpoint_(dt_train_resume *r, const dt_ckpt_t *c) {
    r->resumed_world_size = dt_ckpt_world_size(c);
    r->resumed_accumulation = dt_ckpt_meta_config_int(c, "gradient_accumulation_steps");
}

/* ---- one run per checkpoint folder ------------------------------------------- */

#define LOCK_NAME ".dtrun.lock"

static int lock_fd = -1; /* held by rank 0 for the process's life */

/* The lock file of cfg's checkpoint.dir opened (created with the folder), in fd. */
static dt_status_t lock_open(const dt_config_t *cfg, char *path, size_t len, int *fd) {
    DT_CHECK(dt_fs_mkdir_p(cfg->checkpoint.dir));
    snprintf(path, len, "%s/" LOCK_NAME, cfg->checkpoint.dir);
    return dt_fs_open_regular(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644, fd, NULL);
}

/* "another run (pid P on HOST, started T)" from the holder's record, for messages. */
static dt_status_t held(int fd, const char *path, pid_t pid) {
    char rec[256] = "";
    ssize_t n = pread(fd, rec, sizeof rec - 1, 0);
    rec[n > 0 ? n : 0] = '\0';
    char *nl = strchr(rec, '\n');
    if (nl) *nl = '\0';
    char shown[300];
    dt_fs_printable(rec[0] ? rec : "no record", shown, sizeof shown);
    return dt_error(DT_STATUS_CONFIG, "checkpoint.dir is in use by another run (%s; the lock %s is held%s%d): two "
                    "runs saving into one folder would overwrite each other's checkpoints and latest; give this "
                    "run its own checkpoint.dir, or wait for that one to end",
                    shown, path, pid > 0 ? " by pid " : "", pid > 0 ? (int)pid : 0);
}

dt_status_t dt_train_ckpt_lock(const dt_config_t *cfg, int rank) {
    if (rank != 0 || lock_fd >= 0 || !dt_train_ckpt_enabled(cfg) || !cfg->checkpoint.dir || !*cfg->checkpoint.dir)
        return DT_STATUS_OK;
    char path[4200];
    int fd;
    if (lock_open(cfg, path, sizeof path, &fd) != DT_STATUS_OK) { /* each save will say why it cannot write */
        DT_LOG_WARN("checkpoint: cannot lock the folder against another run: %s", dt_error_detail());
        dt_error_clear();
        return DT_STATUS_OK;
    }
    /* fcntl locks: NFS carries them (flock's are local on some mounts), and the
     * kernel drops them when the process ends, however it ends */
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        pid_t pid = fcntl(fd, F_GETLK, &q) == 0 && q.l_type != F_UNLCK ? q.l_pid : 0;
        dt_status_t st = held(fd, path, pid);
        close(fd);
        return st;
    }
    char host[128] = "?", rec[300];
    gethostname(host, sizeof host - 1);
    int n = snprintf(rec, sizeof rec, "pid %d on %s, started %.0f (unix time)\n", (int)getpid(), host, dt_wall_s());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, rec, (size_t)n, 0) != n) /* the lock holds; only the record is lost */
        DT_LOG_WARN("checkpoint: cannot write who holds %s: %s", path, strerror(errno));
    lock_fd = fd;
    return DT_STATUS_OK;
}

dt_status_t dt_train_ckpt_check_start(const dt_config_t *cfg) {
    const char *mode = cfg->checkpoint.resume ? cfg->checkpoint.resume : "auto";
    if (!dt_train_ckpt_enabled(cfg) || strcmp(mode, "never") != 0 || cfg->checkpoint.overwrite) return DT_STATUS_OK;
    char **paths;
    int n;
    /* A folder that cannot be listed holds nothing to write over: the saves will
     * report why they cannot write there. */
    if (dt_ckpt_candidates(cfg->checkpoint.dir, &paths, &n) != DT_STATUS_OK) return DT_STATUS_OK;
    dt_status_t st = DT_STATUS_OK;
    if (n > 0)
        st = dt_error(DT_STATUS_CONFIG,
                      "checkpoint.dir %s already holds checkpoints (%s, %d in all) and checkpoint.resume is "
                      "\"never\": this run would write over them. Choose one: checkpoint.resume: auto (continue "
                      "them), another checkpoint.dir, or checkpoint.overwrite: true (save beside them; keep_last "
                      "then deletes only this run's)",
                      cfg->checkpoint.dir, paths[0], n);
    dt_ckpt_free_list(paths, n);
    return st;
}

/* The launcher restarted this launch's workers (--max_restarts, a resize). */
static int restarted(void) {
    const char *rc = getenv("TORCHELASTIC_RESTART_COUNT");
    return rc && atoi(rc) > 0;
}

/* The checkpoint at path was saved by the run run_id. */
static int same_run(const char *path, const char *run_id) {
    dt_ckpt_t *c;
    if (!run_id || dt_ckpt_open(path, &c) != DT_STATUS_OK) {
        dt_error_clear();
        return 0;
    }
    int same = !strcmp(dt_ckpt_run_id(c), run_id);
    dt_ckpt_close(c);
    return same;
}

dt_status_t dt_train_ckpt_resume(const dt_train_ckpt *t, int64_t *step) {
    *step = 0;
    const char *mode = t->cfg->checkpoint.resume ? t->cfg->checkpoint.resume : "auto";
    if (t->run_id && !*t->run_id) new_run_id(t->run_id); /* a checkpoint loaded below replaces it */
    /* never concerns other runs' checkpoints at the first start: a restart of this
     * launch continues from its own (the run id is the launch's, new_run_id) */
    int own_only = !strcmp(mode, "never");
    if (own_only && !restarted()) return DT_STATUS_OK;
    int touched = 0;
    if (strcmp(mode, "auto") != 0 && !own_only) {
        dt_status_t st = load_one(t, mode, step, &touched);
        if (st != DT_STATUS_OK) { /* the config names a checkpoint that cannot be used */
            char detail[1024];
            snprintf(detail, sizeof detail, "%s", dt_error_detail());
            return dt_error(DT_STATUS_CONFIG, "checkpoint.resume: %s", detail);
        }
        return DT_STATUS_OK;
    }
    const char *dir = t->cfg->checkpoint.dir;
    if (!dir || !*dir) return DT_STATUS_OK;
    char **paths;
    int n;
    DT_CHECK(dt_ckpt_candidates(dir, &paths, &n));
    dt_status_t st = DT_STATUS_OK;
    int loaded = 0;
    int own = 0;
    for (int i = 0; i < n && !loaded; i++) {
        if (own_only && !same_run(paths[i], t->run_id)) continue; /* another run's */
        own++;
        st = load_one(t, paths[i], step, &touched);
        if (t->agree) { /* every rank must take the same checkpoint */
            char detail[1024];
            snprintf(detail, sizeof detail, "%s", dt_error_detail());
            int ok = st == DT_STATUS_OK;
            DT_CHECK(t->agree(t->agree_ctx, &ok));
            if (st == DT_STATUS_OK && !ok) st = dt_error(DT_STATUS_MISMATCH, "another rank could not load it");
            else if (st != DT_STATUS_OK) dt_error(st, "%s", detail);
        }
        if (st == DT_STATUS_OK) loaded = 1;
        else if (t->rank == 0)
            DT_LOG_WARN("checkpoint: cannot resume from %s: %s%s", paths[i], dt_error_detail(),
                        i + 1 < n ? "; trying the previous one" : "");
    }
    if (!loaded) {
        *step = 0;
        if ((own_only ? own : n) > 0 && t->rank == 0)
            DT_LOG_WARN("checkpoint: no loadable checkpoint in %s: starting from step 0", dir);
        if (touched && t->load) st = t->load(t->load_ctx, NULL); /* the strategy's fresh state */
        else if (touched) st = reinit(t);
        else st = DT_STATUS_OK;
    }
    dt_ckpt_free_list(paths, n);
    return st;
}

/* ---- preemption ------------------------------------------------------------ */

static volatile sig_atomic_t preempt_signo;

/* A SIGTERM the agent queued with DT_STOP_GROUP_FAILURE: another rank failed and
 * the group is being stopped; a save would wait at a barrier the dead rank never
 * reaches, so exit now (only async-signal-safe calls here). Any other signal:
 * recorded, the step finishes and the preemption save follows. */
static void on_preempt(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    if (sig == SIGTERM && si && si->si_code == SI_QUEUE && si->si_value.sival_int == DT_STOP_GROUP_FAILURE &&
        si->si_pid == getppid()) {
        static const char msg[] = "dtrun worker: the agent stops the group after a failure: exiting without a "
                                  "preemption save\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        _exit(128 + SIGTERM);
    }
    if (!preempt_signo) preempt_signo = sig;
}

void dt_train_ckpt_catch_preemption(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_preempt;
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
}

int dt_train_ckpt_preempted(void) { return preempt_signo; }

void dt_train_ckpt_next_launch(const dt_config_t *cfg, int saved, char *out, size_t len) {
    const char *mode = cfg->checkpoint.resume ? cfg->checkpoint.resume : "auto";
    const char *cont = "checkpoint.resume=auto continues from it";
    if (!saved)
        snprintf(out, len, "nothing was saved (checkpoint.every_steps 0): the next launch starts at step 1");
    else if (!strcmp(mode, "auto"))
        snprintf(out, len, "checkpoint saved; the next launch resumes from it (checkpoint.resume auto)");
    else if (!strcmp(mode, "never") && cfg->checkpoint.overwrite)
        snprintf(out, len, "checkpoint saved; checkpoint.resume is \"never\", so the next launch of this config "
                 "starts again at step 1 (%s)", cont);
    else if (!strcmp(mode, "never"))
        snprintf(out, len, "checkpoint saved; checkpoint.resume is \"never\", so the next launch of this config "
                 "is refused: checkpoint.dir holds checkpoints (%s)", cont);
    else
        snprintf(out, len, "checkpoint saved; checkpoint.resume names %s, so the next launch of this config starts "
                 "from that one again (%s)", mode, cont);
}

/* ---- metrics after a resume ----------------------------------------------- */

dt_status_t dt_train_ckpt_trim_metrics(const char *log_dir, int64_t step, int64_t *last) {
    *last = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", log_dir);
    int fd;
    struct stat sb;
    if (stat(path, &sb) != 0) return DT_STATUS_OK; /* none yet */
    DT_CHECK(dt_fs_open_regular(path, O_RDONLY, 0, &fd, NULL)); /* a FIFO would block */
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return DT_STATUS_OK;
    }
    size_t cap = 1 << 16, len = 0;
    char *keep = dt_xmalloc(cap), *line = NULL;
    size_t lcap = 0;
    ssize_t n;
    while ((n = getline(&line, &lcap, f)) > 0) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step");
        int ok = cJSON_IsNumber(s) && s->valuedouble <= (double)step;
        if (cJSON_IsNumber(s) && s->valuedouble > (double)*last && s->valuedouble < 9e15) *last = (int64_t)s->valuedouble;
        cJSON_Delete(o);
        if (!ok) continue;
        if (len + (size_t)n + 1 > cap) keep = dt_xrealloc(keep, cap = 2 * (len + (size_t)n + 1));
        memcpy(keep + len, line, (size_t)n);
        len += (size_t)n;
    }
    free(line);
    fclose(f);
    keep[len] = 0;
    dt_status_t st = dt_metrics_write_file(log_dir, "metrics.jsonl", keep);
    free(keep);
    return st;
}

/* ---- fault injection ---------------------------------------------------------- */

void dt_train_ckpt_fault_point(int rank, int64_t step) {
    static int init;
    static int64_t kill_step = -1, term_step = -1;
    static int kill_rank;
    if (!init) {
        init = 1;
        const char *s = getenv("DTRUN_FAULT_KILL_STEP"), *r = getenv("DTRUN_FAULT_KILL_RANK");
        const char *rc = getenv("TORCHELASTIC_RESTART_COUNT");
        if (s && *s && (!rc || !*rc || atoi(rc) == 0)) kill_step = strtoll(s, NULL, 10);
        kill_rank = r && *r ? atoi(r) : 0;
        const char *t = getenv("DTRUN_FAULT_TERM_PARENT_STEP");
        if (t && *t && (!rc || !*rc || atoi(rc) == 0)) term_step = strtoll(t, NULL, 10);
    }
    if (step == term_step && rank == kill_rank) {
        DT_LOG_WARN("fault injection: DTRUN_FAULT_TERM_PARENT_STEP=%lld: SIGTERM to the parent (pid %d), as a "
                    "scheduler preempting the job would",
                    (long long)step, (int)getppid());
        kill(getppid(), SIGTERM);
    }
    if (step == kill_step && rank == kill_rank) {
        DT_LOG_WARN("fault injection: DTRUN_FAULT_KILL_STEP=%lld: SIGKILL to rank %d", (long long)step, rank);
        raise(SIGKILL);
    }
}
