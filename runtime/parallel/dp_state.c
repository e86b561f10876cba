/*
 * dp_state.c - what a data-parallel object (dp.h) does with the model state it
 * holds: the gradient norm and the optimizer step on the local shard (then, for
 * ZeRO-1/2, the updated slices gathered back), whole parameters for sampling and
 * export, and the byte ranges a checkpoint saves and loads.
 */
#include "runtime/parallel/dp_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"

static void *grad_ptr(dt_dp_t *dp, const dt_dp_run *r) {
    return dp->sharded_grads ? at(dp->gshard, r->shard_offset, dp->es) : at(dp->grads, r->padded_offset, dp->es);
}

static void *param_ptr(dt_dp_t *dp, const dt_dp_run *r) {
    return dp->sharded_params ? at(dp->pshard, r->shard_offset, dp->es) : at(dp->params, r->padded_offset, dp->es);
}

/* Sum of squares of this rank's gradient elements that belong to tensors every TP
 * rank holds whole (tensor parallelism). The ranges are found on the first call:
 * the gradient buffers do not move. */
static double replicated_sq(dt_dp_t *dp) {
    if (!dp->rep_found) {
        const dt_model_layout *l = dp->layout;
        int cap = 0;
        for (int i = 0; i < dp->plan.n_runs; i++) {
            const dt_dp_run *r = &dp->plan.runs[i];
            for (int j = 0; j < l->n_tensors; j++) {
                const dt_tensor_info *t = &l->tensors[j];
                if (t->tp_split != DT_TP_REPLICATED) continue;
                size_t a = t->offset > r->offset ? t->offset : r->offset;
                size_t e = t->offset + t->numel < r->offset + r->count ? t->offset + t->numel : r->offset + r->count;
                if (a >= e) continue;
                if (dp->rep_n == cap) {
                    cap = cap ? 2 * cap : 64;
                    dp->rep_ptrs = dt_xrealloc(dp->rep_ptrs, (size_t)cap * sizeof *dp->rep_ptrs);
                    dp->rep_counts = dt_xrealloc(dp->rep_counts, (size_t)cap * sizeof *dp->rep_counts);
                }
                dp->rep_ptrs[dp->rep_n] = at(grad_ptr(dp, r), a - r->offset, dp->es);
                dp->rep_counts[dp->rep_n++] = e - a;
            }
        }
        dp->rep_found = 1;
    }
    return dp->rep_n ? dp->dev->ops->grad_sq_norm_ranges(dp->dev, dp->rep_ptrs, dp->rep_counts, dp->rep_n) : 0.0;
}

/* The sum of sq over the ranks of comm (in place). */
static dt_status_t sum_over(dt_dp_t *dp, dt_comm_t *comm, double *sq) {
    int n = dt_comm_size(comm);
    double *all = dt_xcalloc((size_t)n, sizeof(double));
    dt_status_t st = dp_all_gather_f64(dp, comm, sq, 1, all);
    *sq = 0;
    for (int r = 0; r < n; r++) *sq += all[r];
    free(all);
    return st;
}

dt_status_t dt_dp_grad_norm(dt_dp_t *dp, double *norm) {
    double sq = 0;
    if (!dp->sharded_optim) /* one call over the whole buffer (padding is zero): one device sync, not one per run */
        sq = dp->dev->ops->grad_sq_norm(dp->dev, dp->grads, dp->plan.padded_total);
    else { /* ZeRO: the shard's runs in one call, so one device sync in all */
        int n = dp->plan.n_runs;
        const void **ptrs = dt_xcalloc((size_t)(n ? n : 1), sizeof *ptrs);
        size_t *counts = dt_xcalloc((size_t)(n ? n : 1), sizeof *counts);
        for (int i = 0; i < n; i++) {
            ptrs[i] = grad_ptr(dp, &dp->plan.runs[i]);
            counts[i] = dp->plan.runs[i].count;
        }
        sq = dp->dev->ops->grad_sq_norm_ranges(dp->dev, ptrs, counts, n);
        free(ptrs);
        free(counts);
    }
    if (dp->opts.tp) { /* replicated tensors: identical on every TP rank, counted once */
        double rep = replicated_sq(dp);
        sq -= rep * (1.0 - 1.0 / dt_comm_size(dp->opts.tp));
    }
    if (dp->shard) DT_CHECK(sum_over(dp, dp->shard, &sq));
    if (dp->opts.tp) DT_CHECK(sum_over(dp, dp->opts.tp, &sq));
    if (dp->opts.pp) DT_CHECK(sum_over(dp, dp->opts.pp, &sq)); /* every stage's share of the model */
    *norm = sqrt(sq > 0 ? sq : 0);
    return DT_STATUS_OK;
}

dt_status_t dt_dp_params_range(dt_dp_t *dp, size_t offset, size_t count, void *dst) {
    const dt_ops_t *o = dp->dev->ops;
    dt_status_t st = DT_STATUS_OK;
    for (int b = 0; b < dp->plan.n_buckets && st == DT_STATUS_OK; b++) {
        const dt_dp_bucket *bk = &dp->plan.buckets[b];
        size_t a = bk->offset > offset ? bk->offset : offset;
        size_t e = bk->offset + bk->count < offset + count ? bk->offset + bk->count : offset + count;
        if (a >= e) continue;
        void *to = at(dst, a - offset, dp->es);
        if (!dp->sharded_params) { /* the full buffer, padded layout */
            st = o->copy(dp->dev, to, at(dp->params, bk->padded_offset + (a - bk->offset), dp->es), (e - a) * dp->es,
                         DT_COPY_DEVICE_TO_DEVICE);
            continue;
        }
        int held = dp->bs[b].pstate != PSTATE_NONE; /* gathered already (a unit in use): keep it */
        st = dp_param_ready(dp, b);
        if (st == DT_STATUS_OK)
            st = o->copy(dp->dev, to, at(dp->pslots[dp->bs[b].pslot].buf, a - bk->offset, dp->es), (e - a) * dp->es,
                         DT_COPY_DEVICE_TO_DEVICE);
        if (!held) {
            dt_status_t s2 = dp_param_release(dp, b);
            if (st == DT_STATUS_OK) st = s2;
        }
    }
    if (st == DT_STATUS_OK) st = o->synchronize(dp->dev);
    return st;
}

/* ZeRO-1/2: every rank's updated slices back into every rank's full buffer. */
dt_status_t dp_gather_full_params(dt_dp_t *dp) {
    if (!dp->shard || dp->sharded_params) return DT_STATUS_OK;
    dt_status_t st = DT_STATUS_OK;
    for (int b = 0; b < dp->plan.n_buckets && st == DT_STATUS_OK; b++) {
        const dt_dp_bucket *bk = &dp->plan.buckets[b];
        char *p = at(dp->params, bk->padded_offset, dp->es);
        st = dt_comm_all_gather_async(dp->shard, at(p, (size_t)dp->shard_rank * bk->slice, dp->es), p, bk->slice,
                                      comm_dtype(dp), &dp->bs[b].req);
        if (st == DT_STATUS_OK) dp->bs[b].req_live = 1;
    }
    for (int b = 0; b < dp->plan.n_buckets; b++) {
        if (!dp->bs[b].req_live) continue;
        dt_status_t s2 = dp_wait_req(dp, &dp->bs[b].req);
        dp->bs[b].req_live = 0;
        if (st == DT_STATUS_OK) st = s2;
    }
    return st;
}

dt_status_t dt_dp_optimizer_step(dt_dp_t *dp, const dt_adamw_args_t *args) {
    DT_CHECK(dt_dp_check(dp));
    DT_CHECK(dp_params_release_all(dp));
    if (dp->offload) { /* on the host (dp_offload.c), then the same gather */
        DT_CHECK(dp_offload_step(dp, args));
        return dp_gather_full_params(dp);
    }
    for (int i = 0; i < dp->plan.n_runs; i++) {
        const dt_dp_run *r = &dp->plan.runs[i];
        dp->dev->ops->adamw(dp->dev, param_ptr(dp, r), dp->master ? dp->master + r->shard_offset : NULL,
                            grad_ptr(dp, r), dp->m + r->shard_offset,
                            dp->v + r->shard_offset, r->count, args, r->decay);
    }
    DT_CHECK(dp->dev->ops->synchronize(dp->dev));
    return dp_gather_full_params(dp);
}

/* ---- whole parameters, checkpoint ranges ------------------------------------------------------ */

dt_status_t dt_dp_gather_params(dt_dp_t *dp, float *out) {
    const dt_ops_t *o = dp->dev->ops;
    DT_CHECK(dp_params_release_all(dp));
    for (int b = 0; b < dp->plan.n_buckets; b++) {
        const dt_dp_bucket *bk = &dp->plan.buckets[b];
        const void *src;
        if (dp->sharded_params) {
            DT_CHECK(dp_param_ready(dp, b));
            src = dp->pslots[dp->bs[b].pslot].buf;
        } else {
            src = at(dp->params, bk->padded_offset, dp->es);
        }
        DT_CHECK(o->download_f32(dp->dev, out + bk->offset, src, bk->count));
        DT_CHECK(dp_param_release(dp, b));
    }
    return o->synchronize(dp->dev);
}

/* Fills ranges this rank holds (all = every held range; else only those it writes). */
int dp_held_ranges(const dt_dp_t *dp, dt_dp_range *out, int max, int all) {
    int n = 0;
    if (!dp->sharded_optim) {
        size_t total = dp->layout->n_params, off = 0, cnt = total;
        if (!all) {
            off = dt_comm_slice_offset(total, dp->world_size, dp->rank);
            cnt = dt_comm_slice_count(total, dp->world_size, dp->rank);
        }
        if (cnt > 0 && max > 0) {
            void *cp = at(dp->params, off, dp->es);
            out[0] = (dt_dp_range){off, cnt, dp->master ? dp->master + off : (float *)cp, dp->m + off, dp->v + off,
                                   dp->master ? cp : NULL, 0};
        }
        return cnt > 0;
    }
    if (!all && dp->replica_rank != 0) return 0;
    for (int k = dp->plan.n_buckets - 1; k >= 0; k--) {
        const dt_dp_bucket *bk = &dp->plan.buckets[k];
        size_t a = (size_t)dp->shard_rank * bk->slice, e = a + bk->slice;
        if (e > bk->count) e = bk->count;
        if (a >= e) continue;
        if (n < max) {
            void *cp = dp->sharded_params ? at(dp->pshard, bk->shard_offset, dp->es)
                                          : at(dp->params, bk->padded_offset + a, dp->es);
            out[n] = (dt_dp_range){bk->offset + a, e - a, dp->master ? dp->master + bk->shard_offset : (float *)cp,
                                   dp->m + bk->shard_offset, dp->v + bk->shard_offset, dp->master ? cp : NULL,
                                   dp->offload};
        }
        n++;
    }
    return n;
}

int dt_dp_owned_ranges(const dt_dp_t *dp, dt_dp_range *out, int max) { return dp_held_ranges(dp, out, max, 0); }

int dt_dp_has_master(const dt_dp_t *dp) { return dp->master != NULL; }

int dt_dp_offloaded(const dt_dp_t *dp) { return dp->offload; }

/* The compute-dtype parameters of a range from its fp32 masters (after a load),
 * through the host in chunks: rare (resume), so simple beats fast. */
static dt_status_t refresh_from_master(dt_dp_t *dp, const dt_dp_range *r) {
    if (!r->cparam) return DT_STATUS_OK;
    const dt_ops_t *o = dp->dev->ops;
    size_t chunk = r->count < ((size_t)1 << 22) ? r->count : ((size_t)1 << 22);
    float *h = dt_mem_alloc(DT_MEM_OTHER, (chunk ? chunk : 1) * sizeof(float));
    if (!h) return DT_STATUS_NOMEM;
    dt_status_t st = DT_STATUS_OK;
    for (size_t i = 0; i < r->count && st == DT_STATUS_OK; i += chunk) {
        size_t k = r->count - i < chunk ? r->count - i : chunk;
        if (r->host) memcpy(h, r->param + i, k * sizeof(float)); /* offloaded masters */
        else st = o->copy(dp->dev, h, r->param + i, k * sizeof(float), DT_COPY_DEVICE_TO_HOST);
        if (st == DT_STATUS_OK) st = o->upload_f32(dp->dev, at(r->cparam, i, dp->es), h, k);
        if (st == DT_STATUS_OK) st = o->synchronize(dp->dev);
    }
    dt_mem_free(h);
    return st;
}

dt_status_t dt_dp_load_ranges(dt_dp_t *dp, dt_dp_read_fn read, void *ctx) {
    DT_CHECK(dp_params_release_all(dp));
    int max = dp->plan.n_buckets + 1;
    dt_dp_range *r = dt_xcalloc((size_t)max, sizeof *r);
    int n = dp_held_ranges(dp, r, max, 1);
    dt_status_t st = DT_STATUS_OK;
    for (int i = 0; i < n && st == DT_STATUS_OK; i++) st = read(ctx, &r[i]);
    for (int i = 0; i < n && st == DT_STATUS_OK; i++) st = refresh_from_master(dp, &r[i]);
    free(r);
    DT_CHECK(st);
    return dp_gather_full_params(dp);
}

void dt_dp_get_stats(const dt_dp_t *dp, dt_dp_stats *out) { *out = dp->stats; }

void dt_dp_expected_mem(const dt_dp_t *dp, dt_dp_mem *m) {
    size_t full = dp->plan.padded_total, shard = dp->plan.shard_total, es = dp->es;
    memset(m, 0, sizeof *m);
    m->params = (dp->sharded_params ? shard : full) * es;
    m->grads = (dp->sharded_grads ? shard : full) * es;
    m->optim = 2 * shard * sizeof(float);
    m->master = dp->master ? shard * sizeof(float) : 0;
    if (dp->offload) { /* none of it on the device */
        m->host_master = m->master;
        m->host_optim = m->optim;
        m->host_grads = shard * es;
        m->master = m->optim = 0;
    }
    m->work = ((size_t)dp->n_gslots + (size_t)dp->n_pslots) * dp->work_elems * es;
}
