/*
 * comm_hier.c - hierarchical backend for several nodes with several ranks each:
 * shared memory inside a node, the TCP ring between nodes.
 *
 * Ranks are numbered node by node (torchrun's order): rank r is local rank
 * r % L of node r / L, L = local_world_size. Two sub-communicators: "node" (the
 * L ranks of this node, shm) and "lr" (the ranks with this local rank on every
 * node, tcp; its rank is the node index).
 *
 * all_reduce: the input is widened to fp32 and zero-padded to L*q elements
 * (q = ceil(count / L)); reduce-scatter inside the node (each local rank gets q
 * elements of the node's sum), all-reduce of that piece across nodes, avg
 * division, all-gather inside the node (bf16: each rank rounds its piece once
 * first, so the gather moves final bf16 values, half the bytes), then the copy
 * to the output. Partial sums stay fp32 throughout. The
 * sum of element i is therefore: within each node in local-rank order, then
 * across nodes in ring order. Every node link carries 1/L of the data.
 * reduce_scatter: all_reduce into a work buffer, then this rank's slice.
 * all_gather: inside the node, then node blocks across nodes.
 * broadcast: across nodes among the root's local rank, then inside each node.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "runtime/comm/comm_impl.h"

typedef struct hier_be {
    dt_comm_t *node, *lr;
    int L, N, nd, lrank;
    float *work;
    size_t cap;
    uint16_t *work16; /* bf16 results, gathered inside the node */
    size_t cap16;
} hier_be_t;

static void hier_free(dt_comm_t *comm) {
    hier_be_t *be = comm->be;
    if (!be) return;
    dt_comm_free(be->node);
    dt_comm_free(be->lr);
    dt_mem_free(be->work);
    dt_mem_free(be->work16);
    free(be);
    comm->be = NULL;
}

static dt_status_t hier_init(dt_comm_t *comm) {
    hier_be_t *be = dt_xcalloc(1, sizeof(*be));
    comm->be = be;
    int L = comm->local_world_size;
    if (L < 1 || comm->size % L != 0)
        return dt_error(DT_STATUS_CONFIG, "hier comm: local world size %d does not divide %d ranks", L, comm->size);
    be->L = L;
    be->N = comm->size / L;
    be->nd = comm->rank / L;
    be->lrank = comm->rank % L;
    int *m = dt_xmalloc(sizeof(int) * (size_t)(L > be->N ? L : be->N));
    char id[256];
    for (int i = 0; i < L; i++) m[i] = comm->members[be->nd * L + i];
    snprintf(id, sizeof(id), "%.200s.node%d", comm->id, be->nd);
    dt_status_t st = dt_comm_create_group_(comm, id, m, L, be->lrank, DT_COMM_BACKEND_SHM, &be->node);
    if (st == DT_STATUS_OK) {
        for (int k = 0; k < be->N; k++) m[k] = comm->members[k * L + be->lrank];
        snprintf(id, sizeof(id), "%.200s.lr%d", comm->id, be->lrank);
        st = dt_comm_create_group_(comm, id, m, be->N, be->nd, DT_COMM_BACKEND_TCP, &be->lr);
    }
    free(m);
    return st;
}

static dt_status_t ensure_work(hier_be_t *be, size_t n) {
    if (be->cap >= n) return DT_STATUS_OK;
    dt_mem_free(be->work);
    be->cap = 0;
    be->work = dt_mem_alloc(DT_MEM_COMM, n * sizeof(float) + 64);
    if (!be->work) return DT_STATUS_NOMEM;
    be->cap = n;
    return DT_STATUS_OK;
}

static dt_status_t ensure_work16(hier_be_t *be, size_t n) {
    if (be->cap16 >= n) return DT_STATUS_OK;
    dt_mem_free(be->work16);
    be->cap16 = 0;
    be->work16 = dt_mem_alloc(DT_MEM_COMM, n * sizeof(uint16_t) + 64);
    if (!be->work16) return DT_STATUS_NOMEM;
    be->cap16 = n;
    return DT_STATUS_OK;
}

/* All-reduce of req's input into be->work (fp32), or for bf16 into be->work16
 * (each local rank rounds its reduced piece once; the node gathers bf16). */
static dt_status_t hier_all_reduce_work(dt_comm_t *comm, hier_be_t *be, const dt_comm_req_t *req) {
    size_t count = req->count_, L = (size_t)be->L;
    size_t q = (count + L - 1) / L, P = q * L;
    DT_CHECK(ensure_work(be, P));
    if (req->dtype_ == DT_COMM_F32)
        memcpy(be->work, req->send_, count * sizeof(float));
    else
        dt_comm_bf16_to_f32_n_(be->work, req->send_, count);
    memset(be->work + count, 0, (P - count) * sizeof(float));
    float *mine = be->work + (size_t)be->lrank * q;
    if (req->redop_ == DT_COMM_MAX) {
        /* reduce_scatter has no max: all-reduce inside the node instead */
        DT_CHECK(dt_comm_run_sub_(be->node, DT_COMM_OP_ALL_REDUCE, be->work, be->work, P, DT_COMM_F32, DT_COMM_MAX, 0));
        DT_CHECK(dt_comm_run_sub_(be->lr, DT_COMM_OP_ALL_REDUCE, mine, mine, q, DT_COMM_F32, DT_COMM_MAX, 0));
    } else {
        DT_CHECK(dt_comm_run_sub_(be->node, DT_COMM_OP_REDUCE_SCATTER, be->work, mine, P, DT_COMM_F32, DT_COMM_SUM, 0));
        DT_CHECK(dt_comm_run_sub_(be->lr, DT_COMM_OP_ALL_REDUCE, mine, mine, q, DT_COMM_F32, DT_COMM_SUM, 0));
        if (req->redop_ == DT_COMM_AVG) {
            float d = (float)comm->size;
            for (size_t i = 0; i < q; i++) mine[i] /= d;
        }
    }
    if (req->dtype_ == DT_COMM_BF16) {
        DT_CHECK(ensure_work16(be, P));
        uint16_t *mine16 = be->work16 + (size_t)be->lrank * q;
        dt_comm_f32_to_bf16_n_(mine16, mine, q, DT_COMM_SUM, 0);
        return dt_comm_run_sub_(be->node, DT_COMM_OP_ALL_GATHER, mine16, be->work16, q, DT_COMM_BF16, DT_COMM_SUM, 0);
    }
    return dt_comm_run_sub_(be->node, DT_COMM_OP_ALL_GATHER, mine, be->work, q, DT_COMM_F32, DT_COMM_SUM, 0);
}

static dt_status_t hier_run(dt_comm_t *comm, dt_comm_req_t *req) {
    hier_be_t *be = comm->be;
    size_t es = dt_comm_dtype_size(req->dtype_);
    switch (req->op_) {
    case DT_COMM_OP_ALL_REDUCE:
        DT_CHECK(hier_all_reduce_work(comm, be, req));
        if (req->dtype_ == DT_COMM_F32)
            memcpy(req->recv_, be->work, req->count_ * sizeof(float));
        else
            memcpy(req->recv_, be->work16, req->count_ * sizeof(uint16_t));
        return DT_STATUS_OK;
    case DT_COMM_OP_REDUCE_SCATTER: {
        DT_CHECK(hier_all_reduce_work(comm, be, req));
        size_t off = dt_comm_slice_offset(req->count_, comm->size, comm->rank);
        size_t len = dt_comm_slice_count(req->count_, comm->size, comm->rank);
        if (req->dtype_ == DT_COMM_F32)
            memmove(req->recv_, be->work + off, len * sizeof(float));
        else
            memmove(req->recv_, be->work16 + off, len * sizeof(uint16_t));
        return DT_STATUS_OK;
    }
    case DT_COMM_OP_ALL_GATHER: {
        size_t c = req->count_, block = (size_t)be->L * c;
        uint8_t *out = req->recv_;
        DT_CHECK(dt_comm_run_sub_(be->node, DT_COMM_OP_ALL_GATHER, req->send_, out + (size_t)be->nd * block * es, c,
                                  req->dtype_, DT_COMM_SUM, 0));
        return dt_comm_run_sub_(be->lr, DT_COMM_OP_ALL_GATHER, out + (size_t)be->nd * block * es, out, block,
                                req->dtype_, DT_COMM_SUM, 0);
    }
    case DT_COMM_OP_BROADCAST: {
        int root_node = req->root_ / be->L, root_lr = req->root_ % be->L;
        if (be->lrank == root_lr)
            DT_CHECK(dt_comm_run_sub_(be->lr, DT_COMM_OP_BROADCAST, req->recv_, req->recv_, req->count_, req->dtype_,
                                      DT_COMM_SUM, root_node));
        return dt_comm_run_sub_(be->node, DT_COMM_OP_BROADCAST, req->recv_, req->recv_, req->count_, req->dtype_,
                                DT_COMM_SUM, root_lr);
    }
    case DT_COMM_OP_BARRIER:
        DT_CHECK(dt_comm_run_sub_(be->node, DT_COMM_OP_BARRIER, NULL, NULL, 0, DT_COMM_F32, DT_COMM_SUM, 0));
        DT_CHECK(dt_comm_run_sub_(be->lr, DT_COMM_OP_BARRIER, NULL, NULL, 0, DT_COMM_F32, DT_COMM_SUM, 0));
        return dt_comm_run_sub_(be->node, DT_COMM_OP_BARRIER, NULL, NULL, 0, DT_COMM_F32, DT_COMM_SUM, 0);
    case DT_COMM_OP_SEND:
    case DT_COMM_OP_RECV: /* comm_p2p.c gives each pair its own shm or tcp channel */
        return dt_error(DT_STATUS_INVALID, "hier: %s runs on a point-to-point channel", dt_comm_op_name(req->op_));
    }
    return dt_error(DT_STATUS_INVALID, "hier: unknown op %d", (int)req->op_);
}

const dt_comm_backend_ops_t dt_comm_hier_ops = {
    .name = "hier",
    .init = hier_init,
    .free = hier_free,
    .run = hier_run,
};
