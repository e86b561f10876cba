/*
 * train_async.c - checkpoint.async's periodic saves (see train_async.h): staging
 * into a host arena kept for the run, the background write, and the commit once
 * every rank's shard is durable.
 */
#include "runtime/train/train_async.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "runtime/ckpt/ckpt_async.h"

struct dt_train_async {
    dt_device_t *dev;       /* owns the arena (host_alloc) */
    float *arena;           /* pinned on CUDA; the staged shard */
    uint64_t arena_elems;
    dt_ckpt_async_t *writer;
    dt_train_ckpt_shard shard; /* ranges into the arena, the extra meta, the arguments */
    int pending;   /* a save started at `step` on every rank, not settled yet */
    int failed;    /* this rank could not stage or start it */
    int committing; /* rank 0: every shard is durable, the commit runs in the background */
    int rank;
    int64_t step;
    char why[32];
    double start_s, stage_s, blocked_s; /* the save's start, its copy, training blocked so far */
    /* the run's figures */
    int saves;
    double blocked_sum_s, write_sum_s;
    int64_t n_params;
    dt_ckpt_save_stats wstats; /* this rank's background write, once waited for */
};

static void drop_shard(dt_train_async *a) {
    dt_train_ckpt_shard_free(&a->shard);
    a->pending = 0;
    a->failed = 0;
    a->committing = 0;
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

/* Rank 0, the background commit over: logs the save and adds it to the figures. */
static void committed(dt_train_async *a, const dt_ckpt_save_stats *cs) {
    const dt_ckpt_save_stats *ws = &a->wstats;
    double write_s = ws->write_s, all_mb = 3.0 * 4.0 * (double)a->n_params / 1e6;
    DT_LOG_INFO("checkpoint: step %lld (%s, async) saved to %s: %.1f MB in all, %.1f MB from this rank "
                "written in the background in %.3f s (%.2f GB/s), committed %.3f s after the step; training "
                "blocked %.1f ms (staging %.1f ms)",
                (long long)a->step, a->why, cs->path, all_mb, (double)ws->shard_bytes / 1e6, write_s,
                write_s > 0 ? (double)ws->shard_bytes / write_s / 1e9 : 0.0, dt_now_s() - a->start_s,
                a->blocked_s * 1e3, a->stage_s * 1e3);
}

/* The save is over on this rank (committed when ok): the figures, then drop it. */
static void finish(dt_train_async *a, int ok) {
    if (ok) {
        a->saves++;
        a->blocked_sum_s += a->blocked_s;
        a->write_sum_s += a->wstats.write_s;
    }
    drop_shard(a);
}

dt_status_t dt_train_async_settle(dt_train_async *a, dt_dp_t *dp, int block) {
    if (!a || !a->pending) return DT_STATUS_OK;
    double t0 = dt_now_s();
    if (a->committing) { /* rank 0 alone: the other ranks are done with this save */
        if (!block && dt_ckpt_async_busy(a->writer)) return DT_STATUS_OK;
        dt_ckpt_save_stats cs;
        dt_status_t st = dt_ckpt_async_wait(a->writer, &cs);
        a->committing = 0;
        a->blocked_s += dt_now_s() - t0;
        if (st != DT_STATUS_OK)
            DT_LOG_ERROR("checkpoint of step %lld (%s, async) failed: %s; training continues", (long long)a->step,
                         a->why, dt_error_detail());
        else
            committed(a, &cs);
        finish(a, st == DT_STATUS_OK);
        return DT_STATUS_OK;
    }
    char detail[1024] = "";
    if (block || !dt_ckpt_async_busy(a->writer)) {
        if (!a->failed && dt_ckpt_async_pending(a->writer) &&
            dt_ckpt_async_wait(a->writer, &a->wstats) != DT_STATUS_OK) {
            snprintf(detail, sizeof detail, "%s", dt_error_detail());
            a->failed = 1;
        }
    }
    double mine[2] = {dt_ckpt_async_pending(a->writer) ? 1.0 : 0.0, a->failed ? 1.0 : 0.0}, all[2];
    DT_CHECK(agree(dp, mine, all));
    if (all[0] > 0) return DT_STATUS_OK; /* a rank still writes: ask again after the next step */
    if (detail[0]) DT_LOG_ERROR("checkpoint of step %lld (%s, async) failed on rank %d: %s; training continues",
                                (long long)a->step, a->why, a->rank, detail);
    if (all[1] > 0) {
        if (a->rank == 0)
            DT_LOG_ERROR("checkpoint of step %lld (%s, async): a rank could not write its shard: not committed, "
                         "the previous checkpoint stays latest; training continues",
                         (long long)a->step, a->why);
        drop_shard(a);
        return DT_STATUS_OK;
    }
    a->blocked_s += dt_now_s() - t0;
    if (a->rank != 0) {
        finish(a, 1);
        return DT_STATUS_OK;
    }
    /* Every rank's shard is durable: rank 0 commits (meta.json, renames, `latest`,
     * pruning) in the background; the next settle or save collects it. */
    if (dt_ckpt_async_commit_start(a->writer) != DT_STATUS_OK) {
        DT_LOG_ERROR("checkpoint of step %lld (%s, async) failed: %s; training continues", (long long)a->step,
                     a->why, dt_error_detail());
        drop_shard(a);
        return DT_STATUS_OK;
    }
    a->committing = 1;
    return block ? dt_train_async_settle(a, dp, 1) : DT_STATUS_OK;
}

dt_status_t dt_train_async_save(dt_train_async **ap, const dt_train_ckpt *t, dt_dp_t *dp, int64_t step,
                                const char *why) {
    double t0 = dt_now_s();
    if (!*ap) {
        dt_train_async *n = dt_xcalloc(1, sizeof *n);
        n->dev = t->dev;
        n->rank = t->rank;
        DT_CHECK(dt_ckpt_async_new(&n->writer));
        *ap = n;
    }
    dt_train_async *a = *ap;
    DT_CHECK(dt_train_async_settle(a, dp, 1)); /* the next save waits for the previous one */
    t0 = dt_now_s(); /* that wait is counted to the previous save */
    a->n_params = (int64_t)(t->layout->global ? t->layout->global->n_params : t->layout->n_params);
    a->pending = 1;
    a->failed = 0;
    memset(&a->wstats, 0, sizeof a->wstats);
    a->step = step;
    snprintf(a->why, sizeof a->why, "%s", why);
    a->start_s = t0;
    dt_status_t st = DT_STATUS_OK;
    uint64_t need = dt_train_ckpt_stage_elems(t);
    if (!a->arena || a->arena_elems != need) { /* once per run: the shard's size does not change */
        if (a->arena) a->dev->ops->host_free(a->dev, a->arena);
        a->arena = NULL;
        void *p = NULL;
        st = a->dev->ops->host_alloc(a->dev, DT_MEM_OTHER, (size_t)(need ? need : 1) * sizeof(float), &p);
        a->arena = p;
        a->arena_elems = st == DT_STATUS_OK ? need : 0;
    }
    if (st == DT_STATUS_OK) st = dt_train_ckpt_stage(t, step, why, a->arena, &a->shard);
    if (st == DT_STATUS_OK) {
        a->stage_s = a->shard.stage_s;
        st = dt_ckpt_async_start(a->writer, &a->shard.args);
    }
    if (st != DT_STATUS_OK) {
        DT_LOG_ERROR("checkpoint of step %lld (%s, async) could not start on rank %d: %s; training continues",
                     (long long)step, why, t->rank, dt_error_detail());
        a->failed = 1;
    }
    a->blocked_s = dt_now_s() - t0;
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
    dt_train_ckpt_shard_free(&a->shard);
    if (a->arena) a->dev->ops->host_free(a->dev, a->arena);
    free(a);
}
