/*
 * dp_offload.c - optimizer offload (ZeRO-Offload) for a data-parallel object (dp.h:
 * dt_dp_opts.offload): the fp32 master weights and Adam m, v of the rank's shard in
 * host memory, the gradient shard copied down as backward reduces it, AdamW on the
 * host's cores, the updated parameters copied back up.
 *
 * Host buffers, all in the shard layout (plan.shard_total elements, like m and v):
 *   master, m, v   fp32                                  category OFFLOAD
 *   hbuf           compute dtype: the reduced gradient shard, then (written over it
 *                  by the step) the new parameters                     OFFLOAD
 * Pinned (dev->ops->host_alloc) when offload_pinned: the copies then run on the
 * device's copy stream beside the compute (copy_async); plain memory otherwise,
 * copied with the blocking copy op (nothing overlaps).
 *
 * The step: wait for the gradient copies, then for each run (dp_plan.c: a range of
 * one weight-decay setting) dt_host_adamw on the host's threads and an upload of its
 * new parameters, which travels while the host updates the next run; one wait at
 * the end. The gradient norm (clipping) is still computed on the device from the
 * device gradients, as without offload.
 */
#include "runtime/parallel/dp_impl.h"

#include <string.h>

#include "common/mem.h"

static dt_status_t host_get(dt_dp_t *dp, size_t bytes, void **out) {
    if (bytes == 0) bytes = 1;
    if (dp->opts.offload_pinned) return dp->dev->ops->host_alloc(dp->dev, DT_MEM_OFFLOAD, bytes, out);
    *out = dt_mem_alloc(DT_MEM_OFFLOAD, bytes);
    return *out ? DT_STATUS_OK : DT_STATUS_NOMEM; /* dt_mem_alloc set the detail */
}

static void host_put(dt_dp_t *dp, void *p) {
    if (!p) return;
    if (dp->opts.offload_pinned) dp->dev->ops->host_free(dp->dev, p);
    else dt_mem_free(p);
}

dt_status_t dp_offload_alloc(dt_dp_t *dp) {
    const dt_ops_t *o = dp->dev->ops;
    if (dp->opts.offload_pinned && (!o->host_alloc || !o->host_free || !o->copy_async || !o->copy_async_wait))
        return dt_error(DT_STATUS_UNSUPPORTED, "zero_optimization.offload_optimizer: device %s has no pinned host "
                        "memory or asynchronous copies (set pin_memory false)", o->name);
    size_t n = dp->plan.shard_total;
    DT_CHECK(host_get(dp, n * sizeof(float), (void **)&dp->master));
    DT_CHECK(host_get(dp, n * sizeof(float), (void **)&dp->m));
    DT_CHECK(host_get(dp, n * sizeof(float), (void **)&dp->v));
    return host_get(dp, n * dp->es, &dp->hbuf);
}

void dp_offload_free(dt_dp_t *dp) {
    if (dp->opts.offload_pinned && dp->dev->ops->copy_async_wait) (void)dp->dev->ops->copy_async_wait(dp->dev);
    host_put(dp, dp->master);
    host_put(dp, dp->m);
    host_put(dp, dp->v);
    host_put(dp, dp->hbuf);
    dp->master = dp->m = dp->v = NULL;
    dp->hbuf = NULL;
}

/* One copy between the device and hbuf: on the copy stream when pinned. */
static dt_status_t move(dt_dp_t *dp, void *dst, const void *src, size_t bytes, dt_copy_kind_t kind) {
    const dt_ops_t *o = dp->dev->ops;
    return dp->opts.offload_pinned ? o->copy_async(dp->dev, dst, src, bytes, kind)
                                   : o->copy(dp->dev, dst, src, bytes, kind);
}

dt_status_t dp_offload_grad_down(dt_dp_t *dp, size_t shard_offset, const void *src, size_t count) {
    return move(dp, at(dp->hbuf, shard_offset, dp->es), src, count * dp->es, DT_COPY_DEVICE_TO_HOST);
}

static void *device_param(dt_dp_t *dp, const dt_dp_run *r) {
    return dp->sharded_params ? at(dp->pshard, r->shard_offset, dp->es) : at(dp->params, r->padded_offset, dp->es);
}

dt_status_t dp_offload_step(dt_dp_t *dp, const dt_adamw_args_t *args) {
    const dt_ops_t *o = dp->dev->ops;
    /* The device's last ops (the final gradient adds) precede the copies queued after
     * them; the copies themselves are what the host waits for. */
    if (dp->opts.offload_pinned) DT_CHECK(o->copy_async_wait(dp->dev));
    dt_dtype_t dt = o->dtype;
    dt_status_t st = DT_STATUS_OK;
    for (int i = 0; i < dp->plan.n_runs && st == DT_STATUS_OK; i++) {
        const dt_dp_run *r = &dp->plan.runs[i];
        void *h = at(dp->hbuf, r->shard_offset, dp->es);
        /* new parameters over the gradients they came from (kernels.h allows it) */
        dt_host_adamw(dp->opts.host_threads, dt, h, dp->master + r->shard_offset, h, dp->m + r->shard_offset,
                      dp->v + r->shard_offset, r->count, 0, args, r->decay);
        st = move(dp, device_param(dp, r), h, r->count * dp->es, DT_COPY_HOST_TO_DEVICE);
    }
    if (dp->opts.offload_pinned) {
        dt_status_t s2 = o->copy_async_wait(dp->dev);
        if (st == DT_STATUS_OK) st = s2;
    }
    return st;
}
