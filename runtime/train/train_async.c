/*
 * train_async.c - checkpoint.async's periodic saves (see train_async.h): staging
 * into a host arena kept for the run, the background write, and rank 0's
 * background commit once every rank's shard is durable.
 */
#include "runtime/train/train_async.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/trace.h" /* defines: dt_trace_span */
#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "runtime/ckpt/ckpt_async.h"

/* One save's own figures, from its start to its commit. */
typedef struct save_rec {
    int64_t step;
    char why[32];
    double start_s, stage_s, blocked_s; /* the save's start, its copy, training blocked so far */
    dt_ckpt_save_stats wstats;          /* this rank's background write, once waited for */
} save_rec;

struct dt_train_async {
    dt_device_t *dev;       /* owns the arena (host_alloc) */
    float *arena;           /* pinned on CUDA; the staged shard */
    uint64_t arena_elems;
    dt_ckpt_async_t *writer;    /* the shard write of `cur` */
    dt_ckpt_async_t *committer; /* rank 0: the commit of `com` */
    dt_train_ckpt_shard shard;  /* ranges into the arena, the extra meta, the arguments */
    int pending;    /* `cur` started at its step on every rank, its write not agreed over yet */
    int failed;     /* this rank could not stage or start it, or its write failed */
    int committing; /* rank 0: every shard of `com` is durable, its commit runs */
    int rank;
    save_rec cur, com;
    /* the run's figures */
    int saves;
    double blocked_sum_s, write_sum_s;
    int64_t n_params;
    double sync_wait_s; /* the waits of the current settle before a synchronous save */
};

static void drop_shard(dt_train_async *a) {
    dt_train_ckpt_shard_free(&a->shard);
    a->pending = 0;
    a->failed = 0;
}

/* Every rank's {still writing, failed} as the maxima over dp's ranks. */
static dt_status_t agree(dt_dp_t *dp, double mine[2], double out[2]) {
    int n = dt_dp_world_size(dp);
    out[0] = mine[0], out[1] = mine[1];
    if (n == 1) return DT_STATUS_OK;
    double *all = dt_xcalloc((size_t)n * 2, sizeof *all);
    dt_status_t st = dt_dp_all_gather_f64(dp, mine, 2, all);
    for (int r = 0; r < n; r++)
        for (int k = 0; k < 2; k++)
            if (all[2 * r + k] > out[k]) out[k] = all[2 * r + k];
    free(all);
    return st;
}

/* A save over on this rank (committed, on rank 0): into the run's figures. */
static void count(dt_train_async *a, const save_rec *r) {
    a->saves++;
    a->blocked_sum_s += r->blocked_s;
    a->write_sum_s += r->wstats.write_s;
}

/* Time a settle waited: the async save's own (it blocked training), or, for a
 * settle before a synchronous save (sync), that save's. */
static void waited(dt_train_async *a, save_rec *r, int sync, double s) {
    if (sync) a->sync_wait_s += s;
    else r->blocked_s += s;
}

/* Rank 0: waits for the commit of `com` (at once when it is over), logs it. */
static void collect_commit(dt_train_async *a, int sync) {
    save_rec *r = &a->com;
    double t0 = dt_now_s();
    dt_ckpt_save_stats cs;
    dt_status_t st = dt_ckpt_async_wait(a->committer, &cs);
    a->committing = 0;
    waited(a, r, sync, dt_now_s() - t0);
    if (st != DT_STATUS_OK) {
        DT_LOG_ERROR("checkpoint of step %lld (%s, async) failed: %s; training continues", (long long)r->step, r->why,
                     dt_error_detail());
        return;
    }
    const dt_ckpt_save_stats *ws = &r->wstats;
    double write_s = ws->write_s, all_mb = 3.0 * 4.0 * (double)a->n_params / 1e6;
    DT_LOG_INFO("checkpoint: step %lld (%s, async) saved to %s: %.1f MB in all, %.1f MB from this rank "
                "written in the background in %.3f s (%.2f GB/s), committed %.3f s after the step; training "
                "blocked %.1f ms (staging %.1f ms)",
                (long long)r->step, r->why, cs.path, all_mb, (double)ws->shard_bytes / 1e6, write_s,
                write_s > 0 ? (double)ws->shard_bytes / write_s / 1e9 : 0.0, dt_now_s() - r->start_s,
                r->blocked_s * 1e3, r->stage_s * 1e3);
    count(a, r);
}

/* wait_write: wait for this rank's write (else only look whether it is over);
 * wait_commit: rank 0 waits for its commit too; sync: before a synchronous save
 * (the waits are that save's time, not training blocked by the async one). */
static dt_status_t settle(dt_train_async *a, dt_dp_t *dp, int wait_write, int wait_commit, int sync) {
    if (!a) return DT_STATUS_OK;
    if (a->committing && (wait_commit || !dt_ckpt_async_busy(a->committer))) collect_commit(a, sync);
    if (!a->pending) return DT_STATUS_OK; /* the same on every rank: the agreement below is collective */
    double t0 = dt_now_s();
    save_rec *r = &a->cur;
    char detail[1024] = "";
    if (wait_write || !dt_ckpt_async_busy(a->writer)) {
        if (!a->failed && dt_ckpt_async_pending(a->writer)) {
            if (dt_ckpt_async_wait(a->writer, &r->wstats) != DT_STATUS_OK) {
                snprintf(detail, sizeof detail, "%s", dt_error_detail());
                a->failed = 1;
            } else { /* the background write on the timeline: it began when the staging ended */
                double w0 = r->start_s + r->stage_s;
                dt_trace_span(DT_TRACE_CKPT, "async write", w0, w0 + r->wstats.write_s);
            }
        }
    }
    double mine[2] = {dt_ckpt_async_pending(a->writer) ? 1.0 : 0.0, a->failed ? 1.0 : 0.0}, all[2];
    DT_CHECK(agree(dp, mine, all));
    waited(a, r, sync, dt_now_s() - t0);
    if (all[0] > 0) return DT_STATUS_OK; /* a rank still writes: ask again after the next step */
    if (detail[0]) DT_LOG_ERROR("checkpoint of step %lld (%s, async) failed on rank %d: %s; training continues",
                                (long long)r->step, r->why, a->rank, detail);
    if (all[1] > 0) {
        if (a->rank == 0)
            DT_LOG_ERROR("checkpoint of step %lld (%s, async): a rank could not write its shard: not committed, "
                         "the previous checkpoint stays latest; training continues",
                         (long long)r->step, r->why);
        drop_shard(a);
        return DT_STATUS_OK;
    }
    if (a->rank != 0) {
        count(a, r);
        drop_shard(a);
        return DT_STATUS_OK;
    }
    /* Every rank's shard is durable: rank 0 commits (meta.json, renames, `latest`,
     * pruning) in the background, after the previous commit (`latest` in step
     * order); the writer is free for the next save meanwhile. */
    if (a->committing) collect_commit(a, sync);
    a->com = *r;
    if (dt_ckpt_async_commit_start(a->committer, dt_ckpt_async_args(a->writer)) != DT_STATUS_OK)
        DT_LOG_ERROR("checkpoint of step %lld (%s, async) failed: %s; training continues", (long long)r->step, r->why,
                     dt_error_detail());
    else
        a->committing = 1;
    drop_shard(a);
    if (wait_commit && a->committing) collect_commit(a, sync);
    return DT_STATUS_OK;
}

dt_status_t dt_train_async_settle(dt_train_async *a, dt_dp_t *dp, int block) {
    if (!a) return DT_STATUS_OK;
    a->sync_wait_s = 0;
    DT_CHECK(settle(a, dp, block, block, block));
    if (block && a->sync_wait_s > 1e-3)
        DT_LOG_INFO("checkpoint: waited %.1f ms for the pending async save (before a synchronous save or a stop)",
                    a->sync_wait_s * 1e3);
    return DT_STATUS_OK;
}

/* *ap, created on first use. */
static dt_status_t get(dt_train_async **ap, const dt_train_ckpt *t) {
    if (*ap) return DT_STATUS_OK;
    dt_train_async *n = dt_xcalloc(1, sizeof *n);
    n->dev = t->dev;
    n->rank = t->rank;
    dt_status_t st = dt_ckpt_async_new(&n->writer);
    if (st == DT_STATUS_OK) st = dt_ckpt_async_new(&n->committer);
    if (st != DT_STATUS_OK) {
        dt_train_async_free(n);
        return st;
    }
    *ap = n;
    return DT_STATUS_OK;
}

/* The staging arena for t's shard: allocated (and its pages touched: zeroed on
 * CPU, pinned on CUDA) once per run; the shard's size does not change. */
static dt_status_t arena(dt_train_async *a, const dt_train_ckpt *t) {
    uint64_t need = dt_train_ckpt_stage_elems(t);
    if (a->arena && a->arena_elems == need) return DT_STATUS_OK;
    if (a->arena) a->dev->ops->host_free(a->dev, a->arena);
    a->arena = NULL;
    a->arena_elems = 0;
    void *p = NULL;
    DT_CHECK(a->dev->ops->host_alloc(a->dev, DT_MEM_OTHER, (size_t)(need ? need : 1) * sizeof(float), &p));
    a->arena = p;
    a->arena_elems = need;
    return DT_STATUS_OK;
}

void dt_train_async_prepare(dt_train_async **ap, const dt_train_ckpt *t) {
    double t0 = dt_now_s();
    if (get(ap, t) != DT_STATUS_OK || arena(*ap, t) != DT_STATUS_OK) {
        DT_LOG_WARN("checkpoint.async: no staging memory yet (%s); the first save tries again", dt_error_detail());
        return;
    }
    DT_LOG_DEBUG("checkpoint.async: %.1f MB of staging ready in %.3f s", (double)(*ap)->arena_elems * 4 / 1e6,
                 dt_now_s() - t0);
}

dt_status_t dt_train_async_save(dt_train_async **ap, const dt_train_ckpt *t, dt_dp_t *dp, int64_t step,
                                const char *why) {
    DT_CHECK(get(ap, t));
    dt_train_async *a = *ap;
    /* The next save waits for the previous one's write (the arena and the writer
     * are reused), not for its commit; that wait is counted to the previous save. */
    DT_CHECK(settle(a, dp, 1, 0, 0));
    double t0 = dt_now_s();
    a->n_params = (int64_t)(t->layout->global ? t->layout->global->n_params : t->layout->n_params);
    a->pending = 1;
    a->failed = 0;
    save_rec *r = &a->cur;
    memset(r, 0, sizeof *r);
    r->step = step;
    snprintf(r->why, sizeof r->why, "%s", why);
    r->start_s = t0;
    dt_status_t st = arena(a, t);
    if (st == DT_STATUS_OK) st = dt_train_ckpt_stage(t, step, why, a->arena, &a->shard);
    if (st == DT_STATUS_OK) {
        r->stage_s = a->shard.stage_s;
        st = dt_ckpt_async_start(a->writer, &a->shard.args);
    }
    if (st != DT_STATUS_OK) {
        DT_LOG_ERROR("checkpoint of step %lld (%s, async) could not start on rank %d: %s; training continues",
                     (long long)step, why, t->rank, dt_error_detail());
        a->failed = 1;
    }
    r->blocked_s = dt_now_s() - t0;
    return DT_STATUS_OK;
}

void dt_train_async_figures(const dt_train_async *a, int *saves, double *blocked_ms, double *write_ms) {
    *saves = a ? a->saves : 0;
    *blocked_ms = *saves ? a->blocked_sum_s * 1e3 / *saves : 0;
    *write_ms = *saves ? a->write_sum_s * 1e3 / *saves : 0;
}

void dt_train_async_summary(const dt_train_async *a, cJSON *summary) {
    int saves;
    double blocked_ms, write_ms;
    dt_train_async_figures(a, &saves, &blocked_ms, &write_ms);
    if (!saves) return;
    cJSON_AddNumberToObject(summary, "ckpt_async_saves", saves);
    cJSON_AddNumberToObject(summary, "ckpt_blocked_ms", blocked_ms);
    cJSON_AddNumberToObject(summary, "ckpt_write_ms", write_ms);
}

void dt_train_async_free(dt_train_async *a) {
    if (!a) return;
    dt_ckpt_async_free(a->writer);
    dt_ckpt_async_free(a->committer);
    dt_train_ckpt_shard_free(&a->shard);
    if (a->arena) a->dev->ops->host_free(a->dev, a->arena);
    free(a);
}
