/*
 * cp.c - context parallelism's ring over the CP group's communicator (cp.h).
 */
#include "runtime/parallel/cp.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h" /* defines: dt_now_s */
#include "common/mem.h"   /* defines: dt_xcalloc */
#include "common/trace.h" /* defines: dt_trace_span */

struct dt_cp {
    dt_comm_t *comm;
    dt_net_t *net;
    dt_device_t *dev;
    dt_comm_req_t *reqs; /* all-to-all: 2 per peer */
    int next, prev;
    dt_status_t st; /* first failure since dt_cp_check */
    char detail[1024];
    double blocked_s;
    dt_comm_req_t req[2]; /* the exchange in flight: its send and its recv */
    int live;
};

static void note(dt_cp_t *cp, dt_status_t st, const char *what, double t0) {
    double t1 = dt_now_s();
    cp->blocked_s += t1 - t0;
    dt_trace_span(DT_TRACE_COMM, what, t0, t1);
    if (st == DT_STATUS_OK || cp->st != DT_STATUS_OK) return;
    cp->st = st;
    snprintf(cp->detail, sizeof cp->detail, "context-parallel %s: %s", what, dt_error_detail());
}

/* Blocks are whole fp32 or bf16 rows: 4-byte words on the wire. */
static void *ring_start(void *ctx, const void *send, void *recv, size_t bytes) {
    dt_cp_t *cp = ctx;
    double t0 = dt_now_s();
    size_t n = bytes / 4;
    dt_status_t st = dt_comm_recv_async(cp->comm, recv, n, DT_COMM_F32, cp->prev, &cp->req[1]);
    if (st == DT_STATUS_OK) {
        st = dt_comm_send_async(cp->comm, send, n, DT_COMM_F32, cp->next, &cp->req[0]);
        if (st != DT_STATUS_OK) (void)dt_comm_wait(&cp->req[1]);
    }
    cp->live = st == DT_STATUS_OK;
    note(cp, st, "ring exchange", t0);
    return cp;
}

static void ring_wait(void *ctx, void *handle) {
    dt_cp_t *cp = ctx;
    (void)handle;
    if (!cp->live) return;
    double t0 = dt_now_s();
    cp->live = 0;
    dt_status_t a = dt_comm_wait(&cp->req[0]), b = dt_comm_wait(&cp->req[1]);
    note(cp, a != DT_STATUS_OK ? a : b, "ring exchange", t0);
}

/* Every peer's block at once (point-to-point channels never wait on each other). */
static void all_to_all(void *ctx, const void *send, void *recv, size_t bytes) {
    dt_cp_t *cp = ctx;
    double t0 = dt_now_s();
    int n = dt_comm_size(cp->comm), r = dt_comm_rank(cp->comm), k = 0;
    size_t words = bytes / 4;
    dt_status_t st = cp->dev->ops->copy(cp->dev, (char *)recv + (size_t)r * bytes, (const char *)send + (size_t)r * bytes,
                                        bytes, DT_COPY_DEVICE_TO_DEVICE);
    for (int i = 1; i < n && st == DT_STATUS_OK; i++) {
        int from = (r + n - i) % n, to = (r + i) % n;
        st = dt_comm_recv_async(cp->comm, (char *)recv + (size_t)from * bytes, words, DT_COMM_F32, from, &cp->reqs[k]);
        if (st != DT_STATUS_OK) break;
        k++;
        st = dt_comm_send_async(cp->comm, (const char *)send + (size_t)to * bytes, words, DT_COMM_F32, to, &cp->reqs[k]);
        if (st == DT_STATUS_OK) k++;
    }
    for (int i = 0; i < k; i++) {
        dt_status_t w = dt_comm_wait(&cp->reqs[i]);
        if (st == DT_STATUS_OK) st = w;
    }
    note(cp, st, "all-to-all", t0);
}

static const dt_net_cp_ops cp_ops = {.ring_start = ring_start, .ring_wait = ring_wait, .all_to_all = all_to_all};

dt_status_t dt_cp_init(dt_cp_t **out, dt_comm_t *comm, dt_device_t *dev, dt_net_t *net) {
    *out = NULL;
    if (!comm) return dt_error(DT_STATUS_INVALID, "context parallelism needs the CP group's communicator");
    const dt_ops_t *o = dev->ops;
    if (!net->layout->cp_ulysses && (!o->attention_block_forward || !o->attention_block_backward || !o->attention_kv_pack ||
        !o->attention_block_finish || !o->attention_block_delta || !o->attention_kv_grad_add))
        return dt_error(DT_STATUS_UNSUPPORTED, "context_parallel.size %d: the %s device has no ring attention ops",
                        dt_comm_size(comm), dt_device_kind_name(dev->kind));
    dt_cp_t *cp = dt_xcalloc(1, sizeof *cp);
    int n = dt_comm_size(comm), r = dt_comm_rank(comm);
    cp->comm = comm;
    cp->net = net;
    cp->dev = dev;
    cp->reqs = dt_xcalloc((size_t)2 * n, sizeof *cp->reqs);
    cp->next = (r + 1) % n;
    cp->prev = (r + n - 1) % n;
    net->cp = &cp_ops;
    net->cp_ctx = cp;
    *out = cp;
    return DT_STATUS_OK;
}

void dt_cp_free(dt_cp_t *cp) {
    if (!cp) return;
    if (cp->live) ring_wait(cp, NULL);
    if (cp->net && cp->net->cp_ctx == cp) cp->net->cp = NULL, cp->net->cp_ctx = NULL;
    free(cp->reqs);
    free(cp);
}

dt_status_t dt_cp_check(dt_cp_t *cp) {
    if (!cp || cp->st == DT_STATUS_OK) return DT_STATUS_OK;
    dt_status_t st = cp->st;
    cp->st = DT_STATUS_OK;
    return dt_error(st, "%s", cp->detail);
}

double dt_cp_take_comm_ms(dt_cp_t *cp) {
    if (!cp) return 0;
    double ms = cp->blocked_s * 1e3;
    cp->blocked_s = 0;
    return ms;
}
