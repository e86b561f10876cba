/*
 * dp.c - data-parallel strategies (dp.h): the model state of each strategy, the
 * net hook that launches gradient reductions and FSDP gathers while forward and
 * backward run, and the step's reductions. The bucket plan is dp_plan.c; the
 * optimizer step on the local shard, whole parameters and checkpoint ranges are
 * dp_state.c; the state they share is dp_impl.h.
 */
#include "runtime/parallel/dp_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/trace.h" /* defines: dt_trace_span */

/* ---- errors, waits ------------------------------------------------------------ */

static void set_err(dt_dp_t *dp, dt_status_t st) {
    if (dp->err != DT_STATUS_OK) return;
    dp->err = st;
    snprintf(dp->err_detail, sizeof dp->err_detail, "%s", dt_error_detail());
}

dt_status_t dt_dp_check(dt_dp_t *dp) {
    if (dp->err == DT_STATUS_OK) return DT_STATUS_OK;
    return dt_error(dp->err, "%s", dp->err_detail);
}

/* The trainer's thread was blocked in communication since t0: comm_ms, and the
 * timeline's "comm" span (what metrics.jsonl's comm_ms sums). */
static void comm_took(dt_dp_t *dp, const char *what, double t0) {
    double t1 = dt_now_s();
    dp->comm_s += t1 - t0;
    dt_trace_span(DT_TRACE_COMM, what, t0, t1);
}

dt_status_t dp_wait_req(dt_dp_t *dp, dt_comm_req_t *req) {
    double t0 = dt_now_s();
    dt_status_t st = dt_comm_wait(req);
    comm_took(dp, "dp wait", t0);
    return st;
}

double dt_dp_take_comm_ms(dt_dp_t *dp) {
    double ms = dp->comm_s * 1e3;
    dp->comm_s = 0;
    return ms;
}

int dt_dp_world_size(const dt_dp_t *dp) { return dp->opts.all ? dt_comm_size(dp->opts.all) : dp->world_size; }
int dt_dp_rank(const dt_dp_t *dp) { return dp->opts.all ? dt_comm_rank(dp->opts.all) : dp->rank; }
const dt_dp_plan *dt_dp_get_plan(const dt_dp_t *dp) { return &dp->plan; }

/* ---- small collectives in double precision ------------------------------------- */

/* all_gather of host floats through a device buffer kept for it (grown as needed). */
static dt_status_t device_all_gather(dt_dp_t *dp, dt_comm_t *comm, const float *send, float *recv, size_t count,
                                     int size) {
    const dt_ops_t *o = dp->dev->ops;
    size_t need = count * (size_t)(size + 1) * sizeof(float);
    if (need > dp->small_bytes) {
        o->free(dp->dev, dp->small);
        dp->small = NULL;
        dp->small_bytes = 0;
        DT_CHECK(o->alloc(dp->dev, DT_MEM_COMM, need, &dp->small));
        dp->small_bytes = need;
    }
    float *dsend = dp->small, *drecv = (float *)dp->small + count;
    DT_CHECK(o->copy(dp->dev, dsend, send, count * sizeof(float), DT_COPY_HOST_TO_DEVICE));
    DT_CHECK(dt_comm_all_gather(comm, dsend, drecv, count, DT_COMM_F32));
    return o->copy(dp->dev, recv, drecv, count * (size_t)size * sizeof(float), DT_COPY_DEVICE_TO_HOST);
}

dt_status_t dp_all_gather_f64(dt_dp_t *dp, dt_comm_t *comm, const double *vals, int n, double *out) {
    int size = comm ? dt_comm_size(comm) : 1;
    if (size == 1) {
        memcpy(out, vals, (size_t)n * sizeof *out);
        return DT_STATUS_OK;
    }
    float *send = dt_xcalloc((size_t)n * 2, sizeof(float));
    float *recv = dt_xcalloc((size_t)n * 2 * (size_t)size, sizeof(float));
    for (int i = 0; i < n; i++) {
        float hi = (float)vals[i];
        send[2 * i] = hi;
        send[2 * i + 1] = isfinite(vals[i]) ? (float)(vals[i] - (double)hi) : 0.0f;
    }
    double t0 = dt_now_s();
    dt_status_t st;
    if (dp->dev->kind == DT_DEVICE_CPU) {
        st = dt_comm_all_gather(comm, send, recv, (size_t)n * 2, DT_COMM_F32);
    } else {
        /* The communicator of a GPU job takes device buffers only (NCCL, or a host
         * backend staging device memory): the few values go through a device buffer. */
        st = device_all_gather(dp, comm, send, recv, (size_t)n * 2, size);
    }
    comm_took(dp, "gather figures", t0);
    if (st == DT_STATUS_OK)
        for (int i = 0; i < n * size; i++) out[i] = (double)recv[2 * i] + (double)recv[2 * i + 1];
    free(send);
    free(recv);
    return st;
}

dt_status_t dt_dp_all_gather_f64(dt_dp_t *dp, const double *vals, int n, double *out) {
    return dp_all_gather_f64(dp, dp->opts.all ? dp->opts.all : dp->world, vals, n, out);
}

/* ---- working buffers --------------------------------------------------------- */

static int slot_get(dp_slot *slots, int n, int owner) {
    for (int i = 0; i < n; i++)
        if (slots[i].owner < 0) {
            slots[i].owner = owner;
            return i;
        }
    return -1;
}

/* Points the units of bucket b at a buffer holding the bucket (grads or params). */
static void bind_bucket(dt_dp_t *dp, int b, void *base, int grads) {
    const dt_dp_bucket *bk = &dp->plan.buckets[b];
    for (int u = bk->unit_lo; u <= bk->unit_hi; u++) {
        void *p = base ? at(base, dp->layout->units[u].offset - bk->offset, dp->es) : NULL;
        if (grads) dp->net->unit_grads[u] = p;
        else dp->net->unit_params[u] = p;
    }
}

/* ---- gradients: zero2 / fsdp (reduce-scatter every micro-step) ------------------ */

/* Waits for the oldest reduce_scatter in flight, adds its slice to the local
 * gradient shard (after the replica all-reduce for hsdp) and frees its buffer. */
static dt_status_t gfifo_pop(dt_dp_t *dp) {
    int b = dp->gfifo[dp->gfifo_head];
    dp->gfifo_head = (dp->gfifo_head + 1) % dp->plan.n_buckets;
    dp->gfifo_len--;
    dp_bstate *s = &dp->bs[b];
    const dt_dp_bucket *bk = &dp->plan.buckets[b];
    s->in_fifo = 0;
    dt_status_t st = s->req_live ? dp_wait_req(dp, &s->req) : DT_STATUS_OK;
    s->req_live = 0;
    void *mine = at(dp->gslots[s->gslot].buf, (size_t)dp->shard_rank * bk->slice, dp->es);
    if (st == DT_STATUS_OK && dp->replica) {
        double t0 = dt_now_s();
        st = dt_comm_all_reduce(dp->replica, mine, mine, bk->slice, comm_dtype(dp), DT_COMM_AVG);
        comm_took(dp, "replica all_reduce", t0);
    }
    if (st == DT_STATUS_OK) { /* the shard's gradient += this micro-step's reduced slice, on the device */
        void *g = at(dp->gshard, bk->shard_offset, dp->es);
        dp->dev->ops->residual_forward(dp->dev, g, g, mine, bk->slice);
        /* offload: the slice is final after the step's last micro-step: down it goes */
        if (dp->offload && s->final) st = dp_offload_grad_down(dp, bk->shard_offset, g, bk->slice);
    }
    dp->gslots[s->gslot].owner = -1;
    s->gslot = -1;
    bind_bucket(dp, b, NULL, 1);
    return st;
}

static dt_status_t grad_buffer_get(dt_dp_t *dp, int b) {
    dp_bstate *s = &dp->bs[b];
    dt_status_t st = DT_STATUS_OK, st2;
    /* A failed pop still frees its buffer: b gets one whatever happens, so the
     * net never writes through a stale pointer; the error is returned after. */
    while (s->in_fifo) /* the previous micro-step's reduction of b */
        if ((st2 = gfifo_pop(dp)) != DT_STATUS_OK && st == DT_STATUS_OK) st = st2;
    if (s->gslot >= 0) return st;
    int i;
    while ((i = slot_get(dp->gslots, dp->n_gslots, b)) < 0) {
        if (dp->gfifo_len == 0) /* at most two buckets are incomplete at once: cannot happen */
            return dt_error(DT_STATUS_LIMIT, "dp: no free gradient buffer for bucket %d", b);
        if ((st2 = gfifo_pop(dp)) != DT_STATUS_OK && st == DT_STATUS_OK) st = st2;
    }
    s->gslot = i;
    const dt_dp_bucket *bk = &dp->plan.buckets[b];
    DT_CHECK(dp->dev->ops->set(dp->dev, dp->gslots[i].buf, 0, bk->slice * (size_t)dp->n_shards * dp->es));
    bind_bucket(dp, b, dp->gslots[i].buf, 1);
    return st;
}

static dt_status_t grad_bucket_launch(dt_dp_t *dp, int b) {
    dp_bstate *s = &dp->bs[b];
    const dt_dp_bucket *bk = &dp->plan.buckets[b];
    char *buf = dp->gslots[s->gslot].buf;
    s->launched = 1;
    s->final = dp->last_micro;
    if (dp->in_backward && dp->opts.overlap_comm) dp->stats.reductions_in_backward++;
    else dp->stats.reductions_after++;
    s->in_fifo = 1;
    dp->gfifo[(dp->gfifo_head + dp->gfifo_len) % dp->plan.n_buckets] = b;
    dp->gfifo_len++;
    if (!dp->shard) return DT_STATUS_OK; /* one shard: the buffer is the gradient */
    DT_CHECK(dt_comm_reduce_scatter_async(dp->shard, buf, at(buf, (size_t)dp->shard_rank * bk->slice, dp->es),
                                          bk->slice * (size_t)dp->n_shards, comm_dtype(dp), DT_COMM_AVG,
                                          &s->req));
    s->req_live = 1;
    return DT_STATUS_OK;
}

/* ---- gradients: ddp / zero1 (full buffer, last micro-step only) ------------------ */

static dt_status_t full_bucket_launch(dt_dp_t *dp, int b) {
    dp_bstate *s = &dp->bs[b];
    const dt_dp_bucket *bk = &dp->plan.buckets[b];
    s->launched = 1;
    if (!dp->world) return DT_STATUS_OK;
    if (dp->in_backward) dp->stats.reductions_in_backward++;
    else dp->stats.reductions_after++;
    char *g = at(dp->grads, bk->padded_offset, dp->es);
    size_t es = dp->es, n = bk->slice * (size_t)dp->n_shards; /* ddp: one shard, slice == count */
    dt_comm_dtype_t t = comm_dtype(dp);
    if (dp->wire) {
        char *w = at(dp->wire, bk->padded_offset, dp->wes);
        dp->dev->ops->cast(dp->dev, w, dp->opts.reduce_dtype, g, dp->dev->ops->dtype, n);
        g = w, es = dp->wes;
        t = dp->opts.reduce_dtype == DT_DTYPE_BF16 ? DT_COMM_BF16 : DT_COMM_F32;
    }
    if (!dp->sharded_optim) /* ddp */
        DT_CHECK(dt_comm_all_reduce_async(dp->world, g, g, bk->count, t, DT_COMM_AVG, &s->req));
    else
        DT_CHECK(dt_comm_reduce_scatter_async(dp->shard, g, at(g, (size_t)dp->shard_rank * bk->slice, es), n, t,
                                              DT_COMM_AVG, &s->req));
    s->req_live = 1;
    return DT_STATUS_OK;
}

/* ---- fsdp parameters ------------------------------------------------------------ */

static dt_status_t param_gather_launch(dt_dp_t *dp, int b, int need) {
    dp_bstate *s = &dp->bs[b];
    if (s->pstate != PSTATE_NONE) return DT_STATUS_OK;
    int i = slot_get(dp->pslots, dp->n_pslots, b);
    if (i < 0) {
        if (!need) return DT_STATUS_OK; /* no room to prefetch: gather when needed */
        return dt_error(DT_STATUS_LIMIT, "dp: no free unit buffer to gather bucket %d", b);
    }
    s->pslot = i;
    const dt_dp_bucket *bk = &dp->plan.buckets[b];
    const void *mine = at(dp->pshard, bk->shard_offset, dp->es);
    dt_status_t st = dp->shard ? dt_comm_all_gather_async(dp->shard, mine, dp->pslots[i].buf, bk->slice,
                                                          comm_dtype(dp), &s->preq)
                               : dp->dev->ops->copy(dp->dev, dp->pslots[i].buf, mine, bk->slice * dp->es,
                                                    DT_COPY_DEVICE_TO_DEVICE);
    if (st != DT_STATUS_OK) {
        dp->pslots[i].owner = -1;
        s->pslot = -1;
        return st;
    }
    s->pstate = PSTATE_FLIGHT;
    if (need) dp->stats.gathers_on_demand++;
    else dp->stats.gathers_prefetched++;
    return DT_STATUS_OK;
}

dt_status_t dp_param_ready(dt_dp_t *dp, int b) {
    dp_bstate *s = &dp->bs[b];
    DT_CHECK(param_gather_launch(dp, b, 1));
    if (s->pstate == PSTATE_FLIGHT) {
        dt_status_t st = dp->shard ? dp_wait_req(dp, &s->preq) : DT_STATUS_OK;
        s->pstate = PSTATE_READY;
        bind_bucket(dp, b, dp->pslots[s->pslot].buf, 0);
        DT_CHECK(st);
    }
    return DT_STATUS_OK;
}

dt_status_t dp_param_release(dt_dp_t *dp, int b) {
    dp_bstate *s = &dp->bs[b];
    dt_status_t st = DT_STATUS_OK;
    if (s->pstate == PSTATE_NONE) return st;
    if (s->pstate == PSTATE_FLIGHT && dp->shard) st = dp_wait_req(dp, &s->preq);
    /* The net must never see a NULL unit: keep the (now unowned) buffer bound. */
    dp->pslots[s->pslot].owner = -1;
    s->pslot = -1;
    s->pstate = PSTATE_NONE;
    return st;
}

dt_status_t dp_params_release_all(dt_dp_t *dp) {
    dt_status_t st = DT_STATUS_OK;
    if (!dp->sharded_params) return st;
    for (int b = 0; b < dp->plan.n_buckets; b++) {
        dt_status_t s2 = dp_param_release(dp, b);
        if (st == DT_STATUS_OK) st = s2;
    }
    return st;
}

/* Position of the next PRE hook of bucket b (backward or not) in the use sequence. */
static int seq_find(dt_dp_t *dp, int b, int bwd) {
    for (int pass = 0; pass < 2; pass++)
        for (int i = pass ? 0 : dp->seq_pos; i < dp->n_seq; i++)
            if (dp->seq[i] == b && dp->seq_bwd[i] == bwd) return i;
    return -1;
}

static int in_lookahead(const dt_dp_t *dp, int b) {
    for (int i = dp->seq_pos; i < dp->seq_pos + DP_PREFETCH && i < dp->n_seq; i++)
        if (dp->seq[i] == b) return 1;
    return 0;
}

/* ---- the hook --------------------------------------------------------------------- */

static dt_status_t on_pre(dt_dp_t *dp, int b, int bwd) {
    if (dp->sharded_params) {
        int pos = seq_find(dp, b, bwd);
        if (pos >= 0) dp->seq_pos = pos + 1;
        DT_CHECK(dp_param_ready(dp, b));
        if (dp->opts.overlap_comm)
            for (int i = dp->seq_pos; i < dp->seq_pos + DP_PREFETCH && i < dp->n_seq; i++)
                DT_CHECK(param_gather_launch(dp, dp->seq[i], 0));
    }
    if (bwd && dp->sharded_grads) DT_CHECK(grad_buffer_get(dp, b));
    return DT_STATUS_OK;
}

static dt_status_t on_post(dt_dp_t *dp, int b, int bwd) {
    if (dp->sharded_params && !in_lookahead(dp, b)) DT_CHECK(dp_param_release(dp, b));
    if (!bwd) return DT_STATUS_OK;
    dp_bstate *s = &dp->bs[b];
    if (--s->posts_left > 0) return DT_STATUS_OK;
    if (dp->sharded_grads) {
        /* Working buffers are per bucket, so zero2/fsdp reduce each bucket when it
         * is done; with overlap off they wait for it at once (nothing overlaps). */
        DT_CHECK(grad_bucket_launch(dp, b));
        return dp->opts.overlap_comm ? DT_STATUS_OK : gfifo_pop(dp);
    }
    if (dp->last_micro && dp->opts.overlap_comm) return full_bucket_launch(dp, b);
    return DT_STATUS_OK;
}

/* After an error the net still runs to the end of its micro-step (a hook cannot stop
 * it; dt_dp_micro_end returns the error): a sharded unit whose gather or gradient
 * buffer never came gets a scratch buffer, so the net never reads or writes through a
 * stale or NULL pointer (a failed all_gather used to end in SIGSEGV in the backward). */
static void bind_sink(dt_dp_t *dp, int b, int bwd) {
    if (!dp->sharded_params && !(bwd && dp->sharded_grads)) return; /* ddp: its buffers stay bound */
    if (!dp->sink) {
        size_t most = 0;
        for (int i = 0; i < dp->plan.n_buckets; i++) {
            size_t n = dp->plan.buckets[i].slice * (size_t)dp->n_shards;
            if (n > most) most = n;
        }
        if (dp->dev->ops->alloc(dp->dev, DT_MEM_COMM, most * dp->es, &dp->sink) != DT_STATUS_OK ||
            dp->dev->ops->set(dp->dev, dp->sink, 0, most * dp->es) != DT_STATUS_OK) {
            dt_error_clear(); /* the first error is the one reported */
            return;
        }
    }
    if (dp->sharded_params && dp->bs[b].pstate != PSTATE_READY) bind_bucket(dp, b, dp->sink, 0);
    if (bwd && dp->sharded_grads && dp->bs[b].gslot < 0) bind_bucket(dp, b, dp->sink, 1);
}

static void dp_hook(void *ctx, int unit, dt_net_phase_t phase) {
    dt_dp_t *dp = ctx;
    int b = dp->plan.unit_bucket[unit];
    int bwd = phase == DT_NET_BWD_PRE || phase == DT_NET_BWD_POST;
    int pre = phase == DT_NET_FWD_PRE || phase == DT_NET_BWD_PRE;
    if (dp->err == DT_STATUS_OK) {
        dp->in_backward = bwd;
        dt_status_t st = pre ? on_pre(dp, b, bwd) : on_post(dp, b, bwd);
        dp->in_backward = 0;
        if (st != DT_STATUS_OK) set_err(dp, st);
    }
    if (dp->err != DT_STATUS_OK && pre) bind_sink(dp, b, bwd);
}

/* The order in which the net calls PRE hooks in one micro-step (net.h): forward
 * in unit order (a tied head, layout.tied_head: then unit 0 again), backward in
 * reverse (a tied head: unit 0 first), a recomputed block's unit (model.h:
 * dt_model_gblock_recompute) used by its forward again just before its backward,
 * so its gather is prefetched like the others and kept from the recompute to the
 * backward (in the lookahead at FWD_POST). Consecutive uses of one bucket merge. */
static void build_sequence(dt_dp_t *dp) {
    const dt_model_layout *l = dp->layout;
    int nu = l->n_units, tied = l->tied_head;
    int cap = 3 * nu + 4, n = 0;
    dp->seq = dt_xcalloc((size_t)cap, sizeof(int));
    dp->seq_bwd = dt_xcalloc((size_t)cap, sizeof(int));
#define PUSH(u, bw)                                                                           \
    do {                                                                                      \
        int b_ = dp->plan.unit_bucket[(u)];                                                   \
        if (n == 0 || dp->seq[n - 1] != b_ || dp->seq_bwd[n - 1] != (bw)) {                   \
            dp->seq[n] = b_;                                                                  \
            dp->seq_bwd[n++] = (bw);                                                          \
        }                                                                                     \
    } while (0)
    for (int u = 0; u < nu; u++) PUSH(u, 0);
    if (tied) {
        PUSH(0, 0);
        PUSH(0, 1);
    }
    for (int u = nu - 1; u >= (tied ? 1 : 0); u--) {
        int g = l->units[u].gunit; /* whole-model unit: block g - 1 */
        if (g >= 1 && dt_model_gblock_recompute(l, g - 1) != DT_MODEL_RECOMPUTE_NONE)
            PUSH(u, 0);
        PUSH(u, 1);
    }
#undef PUSH
    dp->n_seq = n;
}

/* ---- init / free ----------------------------------------------------------------------- */

static dt_status_t alloc_state(dt_dp_t *dp, dt_mem_category_t cat, size_t elems, size_t es, void **out) {
    if (elems == 0) elems = 1;
    return dp->dev->ops->alloc(dp->dev, cat, elems * es, out);
}

/* What the initial parameters come from, as one number ranks compare: a rank with
 * another seed, weight files or model stops the run (before, a checksum of the
 * whole buffer, which a sharded rank no longer holds). */
static uint64_t init_id(const dt_dp_t *dp) {
    const dt_model_layout *l = dp->layout;
    uint64_t w[4] = {dp->opts.fill ? dp->opts.init_id : dp->opts.seed, dp->opts.fill != NULL, l->n_params,
                     (uint64_t)l->n_tensors};
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 8; b++) h = (h ^ ((w[i] >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    return h;
}

static dt_status_t check_identical(dt_dp_t *dp) {
    if (dp->world_size == 1) return DT_STATUS_OK;
    uint64_t id = init_id(dp);
    double v[3]; /* 22 bits each: exact through dt_dp_all_gather_f64 */
    for (int i = 0; i < 3; i++) v[i] = (double)((id >> (22 * i)) & 0x3fffff);
    double *all = dt_xcalloc((size_t)dp->world_size * 3, sizeof(double));
    dt_status_t st = dp_all_gather_f64(dp, dp->world, v, 3, all);
    for (int r = 1; st == DT_STATUS_OK && r < dp->world_size; r++)
        if (memcmp(all + 3 * r, all, 3 * sizeof(double)) != 0)
            st = dt_error(DT_STATUS_MISMATCH,
                          "initial parameters differ between rank 0 (source %06llx%06llx) and rank %d (%06llx%06llx): "
                          "every rank must use the same seed, pretrained weights and model",
                          (unsigned long long)all[1], (unsigned long long)all[0], r,
                          (unsigned long long)all[3 * r + 1], (unsigned long long)all[3 * r]);
    free(all);
    return st;
}

/* Elements per host chunk of the initial parameters (16 MiB of fp32). */
#define DP_INIT_CHUNK ((size_t)1 << 22)

/* The initial parameters of every range this rank holds, chunk by chunk through the
 * host (fp32 masters and the compute copy alike), then ZeRO-1/2 gather the full
 * buffer from the slices as after a step. */
static dt_status_t init_params(dt_dp_t *dp) {
    const dt_ops_t *o = dp->dev->ops;
    int max = dp->plan.n_buckets + 1;
    dt_dp_range *r = dt_xcalloc((size_t)max, sizeof *r);
    int n = dp_held_ranges(dp, r, max, 1);
    size_t most = 0;
    for (int i = 0; i < n; i++)
        if (r[i].count > most) most = r[i].count;
    size_t chunk = most < DP_INIT_CHUNK ? most : DP_INIT_CHUNK;
    float *h = dt_mem_alloc(DT_MEM_OTHER, (chunk ? chunk : 1) * sizeof(float));
    dt_status_t st = h ? DT_STATUS_OK : DT_STATUS_NOMEM;
    for (int i = 0; i < n && st == DT_STATUS_OK; i++) {
        for (size_t k = 0; k < r[i].count && st == DT_STATUS_OK; k += chunk) {
            size_t c = r[i].count - k < chunk ? r[i].count - k : chunk;
            if (dp->opts.fill) st = dp->opts.fill(dp->opts.fill_ctx, r[i].offset + k, c, h);
            else dt_model_init_range(dp->layout, dp->opts.seed, r[i].offset + k, c, h);
            if (st != DT_STATUS_OK) break;
            if (r[i].cparam) {
                if (r[i].host) memcpy(r[i].param + k, h, c * sizeof(float));
                else st = o->copy(dp->dev, r[i].param + k, h, c * sizeof(float), DT_COPY_HOST_TO_DEVICE);
                if (st == DT_STATUS_OK) st = o->upload_f32(dp->dev, at(r[i].cparam, k, dp->es), h, c);
            } else {
                st = o->upload_f32(dp->dev, r[i].param + k, h, c);
            }
            if (st == DT_STATUS_OK) st = o->synchronize(dp->dev); /* h is reused */
        }
    }
    dt_mem_free(h);
    free(r);
    DT_CHECK(st);
    return dp_gather_full_params(dp);
}

dt_status_t dt_dp_init(dt_dp_t **out, const dt_dp_opts *opts, dt_device_t *dev, const dt_model_layout *layout,
                       dt_net_t *net, dt_comm_t *comm) {
    *out = NULL;
    dt_dp_t *dp = dt_xcalloc(1, sizeof *dp);
    dp->opts = *opts;
    dp->dev = dev;
    dp->layout = layout;
    dp->net = net;
    dp->world = comm && dt_comm_size(comm) > 1 ? comm : NULL;
    dp->rank = comm ? dt_comm_rank(comm) : 0;
    dp->world_size = comm ? dt_comm_size(comm) : 1;
    dp->es = dt_dtype_size(dev->ops->dtype);
    dt_strategy_t s = opts->strategy;
    /* what is sharded, and over which group: the strategy table's */
    dp->sharded_optim = dt_strategy_shards(s, DT_STRATEGY_SHARDS_OPTIM);
    dp->sharded_grads = dt_strategy_shards(s, DT_STRATEGY_SHARDS_GRADS);
    dp->sharded_params = dt_strategy_shards(s, DT_STRATEGY_SHARDS_PARAMS);
    int by_node = dt_strategy_get(s) && dt_strategy_get(s)->over == DT_STRATEGY_OVER_NODE;
    for (int i = 0; i < DP_GSLOTS; i++) dp->gslots[i].owner = -1;
    for (int i = 0; i < DP_PSLOTS; i++) dp->pslots[i].owner = -1;
    dt_status_t st = DT_STATUS_OK;
    if (opts->offload && !dp->sharded_optim) {
        st = dt_error(DT_STATUS_CONFIG, "zero_optimization.offload_optimizer needs a sharded optimizer (strategy "
                      "zero1, zero2, fsdp or hsdp; ZeRO stage 1-3), not %s", dt_strategy_name(s));
        goto out_free_dp;
    }
    dp->offload = opts->offload;

    /* Shard and replica groups. */
    dp->n_shards = 1;
    dp->n_replicas = 1;
    if (dp->world && dp->sharded_optim) {
        dp->shard = dp->world;
        if (by_node) { /* hsdp: shard within a node, replicate across nodes */
            int lws = opts->local_world_size > 0 ? opts->local_world_size : dp->world_size;
            if (dp->world_size % lws != 0) {
                st = dt_error(DT_STATUS_CONFIG, "strategy hsdp: world size %d is not a multiple of the %d ranks "
                              "per node", dp->world_size, lws);
                goto out_free_dp;
            }
            int node = dp->rank / lws, local = dp->rank % lws;
            DT_CHECK_GOTO(dt_comm_split(dp->world, node, local, &dp->shard), st, out_free_dp);
            dp->own_shard = 1;
            dt_comm_t *rep = NULL;
            DT_CHECK_GOTO(dt_comm_split(dp->world, local, node, &rep), st, out_free_dp);
            if (rep && dt_comm_size(rep) > 1) dp->replica = rep;
            else dt_comm_free(rep);
            if (dt_comm_size(dp->shard) == 1) { /* one rank per node: plain replication */
                dt_comm_free(dp->shard);
                dp->shard = NULL;
                dp->own_shard = 0;
            }
        }
        if (dp->shard) {
            dp->n_shards = dt_comm_size(dp->shard);
            dp->shard_rank = dt_comm_rank(dp->shard);
        }
        if (dp->replica) {
            dp->n_replicas = dt_comm_size(dp->replica);
            dp->replica_rank = dt_comm_rank(dp->replica);
        }
    }

    size_t cap = opts->bucket_elems > 0 ? opts->bucket_elems : 6553600;
    size_t first = (1u << 20) / dp->es;
    if (first > cap) first = cap;
    if (dp->sharded_params) cap = first = 0; /* one bucket per unit */
    DT_CHECK_GOTO(dt_dp_plan_init(layout, dp->n_shards, dp->shard_rank, first, cap, &dp->plan), st, out_free_dp);
    dp->bs = dt_xcalloc((size_t)dp->plan.n_buckets, sizeof *dp->bs);
    dp->gfifo = dt_xcalloc((size_t)dp->plan.n_buckets, sizeof *dp->gfifo);
    for (int b = 0; b < dp->plan.n_buckets; b++) {
        dp->bs[b].gslot = dp->bs[b].pslot = -1;
        size_t w = dp->plan.buckets[b].slice * (size_t)dp->n_shards;
        if (w > dp->work_elems) dp->work_elems = w;
    }

    /* Model state. */
    size_t full = dp->plan.padded_total, shard = dp->plan.shard_total;
    if (!dp->sharded_params) DT_CHECK_GOTO(alloc_state(dp, DT_MEM_PARAMS, full, dp->es, &dp->params), st, out_free_dp);
    else DT_CHECK_GOTO(alloc_state(dp, DT_MEM_PARAMS, shard, dp->es, &dp->pshard), st, out_free_dp);
    if (!dp->sharded_grads) DT_CHECK_GOTO(alloc_state(dp, DT_MEM_GRADS, full, dp->es, &dp->grads), st, out_free_dp);
    else DT_CHECK_GOTO(alloc_state(dp, DT_MEM_GRADS, shard, dp->es, &dp->gshard), st, out_free_dp);
    if (dp->offload) { /* master, m, v (and the gradient shard's copy) in host memory */
        DT_CHECK_GOTO(dp_offload_alloc(dp), st, out_free_dp);
    } else {
        DT_CHECK_GOTO(alloc_state(dp, DT_MEM_OPTIM, shard, sizeof(float), (void **)&dp->m), st, out_free_dp);
        DT_CHECK_GOTO(alloc_state(dp, DT_MEM_OPTIM, shard, sizeof(float), (void **)&dp->v), st, out_free_dp);
        if (dev->ops->dtype != DT_DTYPE_F32)
            DT_CHECK_GOTO(alloc_state(dp, DT_MEM_MASTER, shard, sizeof(float), (void **)&dp->master), st,
                          out_free_dp);
    }
    if (dp->world && !dp->sharded_grads && opts->reduce_dtype != dev->ops->dtype) {
        if (!dev->ops->cast) {
            st = dt_error(DT_STATUS_UNSUPPORTED, "device %s cannot cast gradients to %s for their reduction",
                          dev->ops->name, dt_dtype_name(opts->reduce_dtype));
            goto out_free_dp;
        }
        dp->wes = dt_dtype_size(opts->reduce_dtype);
        DT_CHECK_GOTO(alloc_state(dp, DT_MEM_COMM, full, dp->wes, &dp->wire), st, out_free_dp);
    }
    if (dp->sharded_grads) {
        dp->n_gslots = dp->plan.n_buckets < DP_GSLOTS ? dp->plan.n_buckets : DP_GSLOTS;
        for (int i = 0; i < dp->n_gslots; i++)
            DT_CHECK_GOTO(alloc_state(dp, DT_MEM_COMM, dp->work_elems, dp->es, &dp->gslots[i].buf), st, out_free_dp);
    }
    if (dp->sharded_params) {
        dp->n_pslots = dp->plan.n_buckets < DP_PSLOTS ? dp->plan.n_buckets : DP_PSLOTS;
        for (int i = 0; i < dp->n_pslots; i++)
            DT_CHECK_GOTO(alloc_state(dp, DT_MEM_COMM, dp->work_elems, dp->es, &dp->pslots[i].buf), st, out_free_dp);
    }

    /* Parameters from the seed or the weight files, the same source on every rank. */
    DT_CHECK_GOTO(check_identical(dp), st, out_free_dp);
    DT_CHECK_GOTO(init_params(dp), st, out_free_dp);

    /* Bind the net: full buffers where they exist; working buffers come and go. */
    for (int b = 0; b < dp->plan.n_buckets; b++) {
        const dt_dp_bucket *bk = &dp->plan.buckets[b];
        bind_bucket(dp, b, dp->sharded_params ? dp->pslots[0].buf : at(dp->params, bk->padded_offset, dp->es), 0);
        bind_bucket(dp, b, dp->sharded_grads ? NULL : at(dp->grads, bk->padded_offset, dp->es), 1);
    }
    build_sequence(dp);
    net->hook = dp_hook;
    net->hook_ctx = dp;
    DT_LOG_DEBUG("dp: %s, %d bucket(s), %d shard(s), shard %zu elements, padded %zu of %zu",
                 dt_strategy_name(s), dp->plan.n_buckets, dp->n_shards, dp->plan.shard_total,
                 dp->plan.padded_total, layout->n_params);
    *out = dp;
    return DT_STATUS_OK;
out_free_dp:
    dt_dp_free(dp);
    return st;
}

static void wait_all(dt_dp_t *dp) {
    if (!dp->bs) return;
    for (int b = 0; b < dp->plan.n_buckets; b++) {
        if (dp->bs[b].req_live) dt_comm_wait(&dp->bs[b].req);
        dp->bs[b].req_live = 0;
        if (dp->bs[b].pstate == PSTATE_FLIGHT && dp->shard) dt_comm_wait(&dp->bs[b].preq);
        dp->bs[b].pstate = PSTATE_NONE;
    }
}

void dt_dp_free(dt_dp_t *dp) {
    if (!dp) return;
    wait_all(dp);
    if (dp->net && dp->net->hook_ctx == dp) {
        dp->net->hook = NULL;
        dp->net->hook_ctx = NULL;
    }
    const dt_ops_t *o = dp->dev->ops;
    if (dp->sink) o->free(dp->dev, dp->sink);
    o->free(dp->dev, dp->params);
    o->free(dp->dev, dp->grads);
    o->free(dp->dev, dp->pshard);
    o->free(dp->dev, dp->gshard);
    if (dp->offload) {
        dp_offload_free(dp);
    } else {
        o->free(dp->dev, dp->m);
        o->free(dp->dev, dp->v);
        o->free(dp->dev, dp->master);
    }
    o->free(dp->dev, dp->small);
    o->free(dp->dev, dp->wire);
    for (int i = 0; i < DP_GSLOTS; i++) o->free(dp->dev, dp->gslots[i].buf);
    for (int i = 0; i < DP_PSLOTS; i++) o->free(dp->dev, dp->pslots[i].buf);
    if (dp->own_shard) dt_comm_free(dp->shard);
    dt_comm_free(dp->replica);
    dt_dp_plan_free(&dp->plan);
    free(dp->rep_ptrs);
    free(dp->rep_counts);
    free(dp->bs);
    free(dp->gfifo);
    free(dp->seq);
    free(dp->seq_bwd);
    free(dp);
}

/* ---- the step ------------------------------------------------------------------------------ */

dt_status_t dt_dp_step_begin(dt_dp_t *dp) {
    DT_CHECK(dt_dp_check(dp));
    const dt_ops_t *o = dp->dev->ops;
    if (dp->grads) DT_CHECK(o->set(dp->dev, dp->grads, 0, dp->plan.padded_total * dp->es));
    if (dp->gshard) DT_CHECK(o->set(dp->dev, dp->gshard, 0, dp->plan.shard_total * dp->es));
    for (int b = 0; b < dp->plan.n_buckets; b++) dp->bs[b].launched = 0;
    return DT_STATUS_OK;
}

void dt_dp_micro_begin(dt_dp_t *dp, int last) {
    dp->last_micro = last;
    dp->seq_pos = 0;
    for (int b = 0; b < dp->plan.n_buckets; b++) {
        const dt_dp_bucket *bk = &dp->plan.buckets[b];
        dp->bs[b].posts_left = bk->unit_hi - bk->unit_lo + 1;
        if (dp->sharded_grads) dp->bs[b].launched = 0;
    }
}

dt_status_t dt_dp_micro_end(dt_dp_t *dp) {
    DT_CHECK(dt_dp_check(dp));
    if (!dp->sharded_grads) return DT_STATUS_OK;
    if (dp->last_micro)
        while (dp->gfifo_len > 0) DT_CHECK(gfifo_pop(dp));
    return DT_STATUS_OK;
}

/* zero1 with offload: the rank's reduced slice of bucket b to the host. */
static dt_status_t slice_down(dt_dp_t *dp, int b) {
    const dt_dp_bucket *bk = &dp->plan.buckets[b];
    return dp_offload_grad_down(dp, bk->shard_offset,
                                at(dp->grads, bk->padded_offset + (size_t)dp->shard_rank * bk->slice, dp->es),
                                bk->slice);
}

dt_status_t dt_dp_reduce_finish(dt_dp_t *dp) {
    DT_CHECK(dt_dp_check(dp));
    if (dp->sharded_grads) {
        while (dp->gfifo_len > 0) DT_CHECK(gfifo_pop(dp));
        return dp_params_release_all(dp);
    }
    if (!dp->world) {
        for (int b = 0; b < dp->plan.n_buckets && dp->offload; b++) /* zero1, one rank: each slice down */
            DT_CHECK(slice_down(dp, b));
        return DT_STATUS_OK;
    }
    for (int b = 0; b < dp->plan.n_buckets; b++)
        if (!dp->bs[b].launched) DT_CHECK(full_bucket_launch(dp, b));
    dt_status_t st = DT_STATUS_OK;
    for (int b = 0; b < dp->plan.n_buckets; b++) {
        if (!dp->bs[b].req_live) continue;
        dt_status_t s2 = dp_wait_req(dp, &dp->bs[b].req);
        dp->bs[b].req_live = 0;
        if (st == DT_STATUS_OK) st = s2;
        if (s2 == DT_STATUS_OK && dp->wire) { /* the reduced gradients back in the compute dtype */
            const dt_dp_bucket *bk = &dp->plan.buckets[b];
            size_t off = bk->padded_offset, n = bk->count;
            if (dp->sharded_optim) off += (size_t)dp->shard_rank * bk->slice, n = bk->slice;
            dp->dev->ops->cast(dp->dev, at(dp->grads, off, dp->es), dp->dev->ops->dtype, at(dp->wire, off, dp->wes),
                               dp->opts.reduce_dtype, n);
        }
        /* offload: this bucket's slice goes down while the next ones are waited for */
        if (s2 == DT_STATUS_OK && dp->offload) {
            dt_status_t s3 = slice_down(dp, b);
            if (st == DT_STATUS_OK) st = s3;
        }
    }
    return st;
}
