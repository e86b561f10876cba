/*
 * tp.c - the layout's groups as communicators (runtime/layout/layout.h cuts the
 * world; here each rank splits it along TP, PP and DP) and tensor parallelism's
 * collectives over the TP group's communicator, for the net's seam (tp.h).
 */
#include "runtime/parallel/tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h" /* defines: dt_now_s */
#include "common/mem.h"   /* defines: dt_xcalloc */
#include "common/trace.h" /* defines: dt_trace_span */
#include "runtime/layout/layout.h" /* defines: dt_layout_of, dt_layout_group_index */

struct dt_tp {
    dt_comm_t *comm;
    dt_device_t *dev;
    dt_net_t *net;
    dt_comm_dtype_t dtype; /* the compute dtype on the wire */
    dt_status_t st;        /* first failure since dt_tp_check */
    char detail[1024];
    double blocked_s;
    dt_comm_req_t req; /* the one async all-reduce in flight */
    int req_live;
};

dt_tp_place dt_tp_place_of(int rank, int world_size, int tp_size, int cp_size, int pp_size) {
    dt_layout_dims dims = dt_layout_dims_of(tp_size, cp_size, pp_size);
    dt_layout l;
    (void)dt_layout_of(&dims, world_size, rank, &l); /* the config checked that the sizes divide the world */
    return (dt_tp_place){.tp_size = dt_layout_tp_size(&l), .tp_rank = dt_layout_tp_rank(&l),
                         .pp_size = dt_layout_pp_size(&l), .pp_rank = dt_layout_pp_rank(&l),
                         .dp_size = dt_layout_dp_size(&l), .dp_rank = dt_layout_dp_rank(&l),
                         .cp_size = dt_layout_cp_size(&l), .cp_rank = dt_layout_cp_rank(&l)};
}

/* A group of one rank is none. */
static void drop_single(dt_comm_t **c) {
    if (c && *c && dt_comm_size(*c) == 1) {
        dt_comm_free(*c);
        *c = NULL;
    }
}

dt_status_t dt_tp_split(dt_comm_t *world, int tp_size, int cp_size, int pp_size, dt_comm_t **tp_comm,
                        dt_comm_t **cp_comm, dt_comm_t **pp_comm, dt_comm_t **dp_comm) {
    *tp_comm = *dp_comm = NULL;
    if (pp_comm) *pp_comm = NULL;
    if (cp_comm) *cp_comm = NULL;
    int rank = dt_comm_rank(world), size = dt_comm_size(world);
    dt_layout_dims dims = dt_layout_dims_of(tp_size, cp_size, pp_size);
    dt_layout l;
    if (tp_size < 1 || cp_size < 1 || pp_size < 1 || dt_layout_of(&dims, size, rank, &l) != DT_STATUS_OK)
        return dt_error(DT_STATUS_CONFIG,
                        "tensor_parallel.size %d x context_parallel.size %d x pipeline.stages %d does not divide the "
                        "world size %d", tp_size, cp_size, pp_size, size);
    /* each group: the ranks of the same other coordinates (its index the colour), by
     * their coordinate along it; the gradients' group by (DP rank, CP rank) */
    dt_comm_t *pp = NULL, *cp = NULL;
    dt_status_t st = dt_comm_split(world, dt_layout_group_index(&l, DT_LAYOUT_TP), dt_layout_tp_rank(&l), tp_comm);
    if (st == DT_STATUS_OK)
        st = dt_comm_split(world, dt_layout_group_index(&l, DT_LAYOUT_CP), dt_layout_cp_rank(&l), &cp);
    if (st == DT_STATUS_OK)
        st = dt_comm_split(world, dt_layout_group_index(&l, DT_LAYOUT_PP), dt_layout_pp_rank(&l), &pp);
    if (st == DT_STATUS_OK)
        st = dt_comm_split(world, dt_layout_group_index_dp_cp(&l), dt_layout_rank_dp_cp(&l), dp_comm);
    if (st != DT_STATUS_OK) {
        dt_comm_free(*tp_comm);
        dt_comm_free(cp);
        dt_comm_free(pp);
        dt_comm_free(*dp_comm);
        *tp_comm = *dp_comm = NULL;
        return st;
    }
    drop_single(tp_comm);
    drop_single(&cp);
    drop_single(&pp);
    drop_single(dp_comm);
    if (pp_comm) *pp_comm = pp;
    else dt_comm_free(pp);
    if (cp_comm) *cp_comm = cp;
    else dt_comm_free(cp);
    return DT_STATUS_OK;
}

/* The trainer's thread was blocked in a TP collective since t0: comm_ms and the
 * timeline's "comm" span. */
static void note(dt_tp_t *tp, dt_status_t st, const char *what, double t0) {
    double t1 = dt_now_s();
    tp->blocked_s += t1 - t0;
    dt_trace_span(DT_TRACE_COMM, what, t0, t1);
    if (st == DT_STATUS_OK || tp->st != DT_STATUS_OK) return;
    tp->st = st;
    snprintf(tp->detail, sizeof tp->detail, "tensor-parallel %s: %s", what, dt_error_detail());
}

static void tp_all_reduce(void *ctx, void *buf, size_t count, int f32, int max) {
    dt_tp_t *tp = ctx;
    double t0 = dt_now_s();
    dt_status_t st = dt_comm_all_reduce(tp->comm, buf, buf, count, f32 ? DT_COMM_F32 : tp->dtype,
                                        max ? DT_COMM_MAX : DT_COMM_SUM);
    note(tp, st, "all-reduce", t0);
}

static void tp_all_gather(void *ctx, const void *send, void *recv, size_t count) {
    dt_tp_t *tp = ctx;
    double t0 = dt_now_s();
    note(tp, dt_comm_all_gather(tp->comm, send, recv, count, tp->dtype), "all-gather", t0);
}

static void tp_reduce_scatter(void *ctx, const void *send, void *recv, size_t count) {
    dt_tp_t *tp = ctx;
    double t0 = dt_now_s();
    note(tp, dt_comm_reduce_scatter(tp->comm, send, recv, count, tp->dtype, DT_COMM_SUM), "reduce-scatter", t0);
}

static void *tp_reduce_start(void *ctx, void *part, void *out, size_t count) {
    dt_tp_t *tp = ctx;
    double t0 = dt_now_s();
    dt_status_t st = part == out
                         ? dt_comm_all_reduce_async(tp->comm, part, part, count, tp->dtype, DT_COMM_SUM, &tp->req)
                         : dt_comm_reduce_scatter_async(tp->comm, part, out, count, tp->dtype, DT_COMM_SUM, &tp->req);
    note(tp, st, part == out ? "all-reduce" : "reduce-scatter", t0);
    tp->req_live = st == DT_STATUS_OK;
    return &tp->req;
}

static void tp_wait(void *ctx, void *handle) {
    dt_tp_t *tp = ctx;
    (void)handle;
    if (!tp->req_live) return;
    double t0 = dt_now_s();
    tp->req_live = 0;
    note(tp, dt_comm_wait(&tp->req), "reduction", t0);
}

static const dt_net_tp_ops tp_ops = {
    .all_reduce = tp_all_reduce,
    .all_gather = tp_all_gather,
    .reduce_scatter = tp_reduce_scatter,
    .reduce_start = tp_reduce_start,
    .wait = tp_wait,
};

dt_status_t dt_tp_init(dt_tp_t **out, dt_comm_t *comm, dt_device_t *dev, dt_net_t *net) {
    *out = NULL;
    if (!comm) return dt_error(DT_STATUS_INVALID, "tensor parallelism needs the TP group's communicator");
    if (dev->ops->dtype != DT_DTYPE_F32 && dev->ops->dtype != DT_DTYPE_BF16)
        return dt_error(DT_STATUS_UNSUPPORTED, "tensor parallelism: compute dtype %s has no wire type",
                        dt_dtype_name(dev->ops->dtype));
    dt_tp_t *tp = dt_xcalloc(1, sizeof *tp);
    tp->comm = comm;
    tp->dev = dev;
    tp->net = net;
    tp->dtype = dev->ops->dtype == DT_DTYPE_BF16 ? DT_COMM_BF16 : DT_COMM_F32;
    net->tp = &tp_ops;
    net->tp_ctx = tp;
    *out = tp;
    return DT_STATUS_OK;
}

void dt_tp_free(dt_tp_t *tp) {
    if (!tp) return;
    if (tp->req_live) (void)dt_comm_wait(&tp->req);
    if (tp->net && tp->net->tp_ctx == tp) tp->net->tp = NULL, tp->net->tp_ctx = NULL;
    free(tp);
}

dt_status_t dt_tp_check(dt_tp_t *tp) {
    if (!tp || tp->st == DT_STATUS_OK) return DT_STATUS_OK;
    dt_status_t st = tp->st;
    tp->st = DT_STATUS_OK;
    return dt_error(st, "%s", tp->detail);
}

double dt_tp_take_comm_ms(dt_tp_t *tp) {
    if (!tp) return 0;
    double ms = tp->blocked_s * 1e3;
    tp->blocked_s = 0;
    return ms;
}
