/*
 * comm_p2p.c - point to point (comm.h): dt_comm_send / dt_comm_recv and their
 * async forms, over one channel per ordered pair of ranks.
 *
 * A channel a -> b of communicator C is a 2-rank communicator (comm.c,
 * dt_comm_create_channel_) with members {global a, global b}: the sender is its
 * rank 0, the receiver its rank 1. Its id, "<C's id>.p<a>-<b>", is what both
 * ends compute, so its store keys and shared-memory names meet without any
 * other exchange. It is made on first use by each end (the first send to b on
 * a, the first recv from a on b); its backend is set up on the channel's own
 * thread, so the op that made it only queues. Its sequence numbers count the
 * messages of that channel: the k-th send matches the k-th recv.
 *
 * Backend of a channel: NCCL when C is NCCL; tcp when C is tcp; shm when C is
 * shm; for hier, shm when both ranks are on one node, else tcp. Each backend
 * runs DT_COMM_OP_SEND / DT_COMM_OP_RECV itself (comm_shm.c, comm_tcp.c,
 * comm_nccl.c), starting with the (count, dtype) exchange comm.h promises.
 */
#include <stdio.h>
#include <stdlib.h>

#include "common/mem.h"
#include "runtime/comm/comm_impl.h"

/* The channel for (peer, dir): dir 0 sends to peer, 1 receives from it. */
static dt_status_t channel(dt_comm_t *comm, int peer, int dir, dt_comm_t **out) {
    if (!comm->p2p) comm->p2p = dt_xcalloc((size_t)comm->size * 2, sizeof(dt_comm_t *));
    dt_comm_t **slot = &comm->p2p[2 * peer + dir];
    if (*slot) {
        *out = *slot;
        return DT_STATUS_OK;
    }
    int src = dir == 0 ? comm->rank : peer, dst = dir == 0 ? peer : comm->rank;
    int members[2] = {comm->members[src], comm->members[dst]};
    dt_comm_backend_t kind = comm->kind;
    if (kind == DT_COMM_BACKEND_HIER) {
        int lws = comm->local_world_size > 0 ? comm->local_world_size : comm->global_size;
        kind = members[0] / lws == members[1] / lws ? DT_COMM_BACKEND_SHM : DT_COMM_BACKEND_TCP;
    }
    char id[200];
    snprintf(id, sizeof(id), "%.160s.p%d-%d", comm->id, src, dst);
    DT_CHECK(dt_comm_create_channel_(comm, id, members, dir == 0 ? 0 : 1, kind, slot));
    *out = *slot;
    return DT_STATUS_OK;
}

static dt_status_t p2p_issue(dt_comm_t *comm, dt_comm_op_t op, void *buf, size_t count, dt_comm_dtype_t dtype,
                             int peer, dt_comm_req_t *req, int blocking) {
    const char *name = dt_comm_op_name(op);
    if (!comm) return dt_error(DT_STATUS_INVALID, "%s: communicator is NULL", name);
    if (!req) return dt_error(DT_STATUS_INVALID, "%s: request is NULL", name);
    if (peer < 0 || peer >= comm->size)
        return dt_error(DT_STATUS_INVALID, "%s: peer %d is not a rank of this communicator (ranks 0..%d)", name, peer,
                        comm->size - 1);
    if (peer == comm->rank)
        return dt_error(DT_STATUS_INVALID, "%s: peer %d is this rank itself (global rank %d)", name, peer,
                        comm->global_rank);
    if (dtype != DT_COMM_F32 && dtype != DT_COMM_BF16)
        return dt_error(DT_STATUS_INVALID, "%s to/from rank %d: unknown dtype %d", name, peer, (int)dtype);
    dt_comm_t *ch = NULL;
    DT_CHECK(channel(comm, peer, op == DT_COMM_OP_SEND ? 0 : 1, &ch));
    req->op_ = op;
    req->send_ = buf;
    req->recv_ = buf; /* a send only reads it */
    req->count_ = count;
    req->dtype_ = dtype;
    req->redop_ = DT_COMM_SUM;
    req->root_ = 0; /* the sender is the channel's rank 0 */
    req->comm_ = NULL;
    return dt_comm_issue_(ch, req, blocking);
}

dt_status_t dt_comm_send_async(dt_comm_t *comm, const void *buf, size_t count, dt_comm_dtype_t dtype, int peer,
                               dt_comm_req_t *req) {
    return p2p_issue(comm, DT_COMM_OP_SEND, (void *)buf, count, dtype, peer, req, 0);
}

dt_status_t dt_comm_recv_async(dt_comm_t *comm, void *buf, size_t count, dt_comm_dtype_t dtype, int peer,
                               dt_comm_req_t *req) {
    return p2p_issue(comm, DT_COMM_OP_RECV, buf, count, dtype, peer, req, 0);
}

dt_status_t dt_comm_send(dt_comm_t *comm, const void *buf, size_t count, dt_comm_dtype_t dtype, int peer) {
    dt_comm_req_t req;
    DT_CHECK(p2p_issue(comm, DT_COMM_OP_SEND, (void *)buf, count, dtype, peer, &req, 1));
    return dt_comm_wait(&req);
}

dt_status_t dt_comm_recv(dt_comm_t *comm, void *buf, size_t count, dt_comm_dtype_t dtype, int peer) {
    dt_comm_req_t req;
    DT_CHECK(p2p_issue(comm, DT_COMM_OP_RECV, buf, count, dtype, peer, &req, 1));
    return dt_comm_wait(&req);
}

dt_status_t dt_comm_p2p_mismatch_(const dt_comm_req_t *req, uint64_t peer_count, uint32_t peer_dtype,
                                  uint64_t peer_seq) {
    const dt_comm_t *ch = req->comm_;
    char what[200];
    dt_comm_describe_(req, what, sizeof(what));
    int peer = ch->members[1 - ch->rank];
    return dt_error(DT_STATUS_MISMATCH,
                    "%s on rank %d: rank %d's matching %s #%llu has count %llu, %s; this %s has count %zu, %s "
                    "(count and dtype must agree on both ends)",
                    what, ch->global_rank, peer, req->op_ == DT_COMM_OP_SEND ? "recv" : "send",
                    (unsigned long long)peer_seq, (unsigned long long)peer_count,
                    dt_comm_dtype_name((dt_comm_dtype_t)peer_dtype), dt_comm_op_name(req->op_), req->count_,
                    dt_comm_dtype_name(req->dtype_));
}

dt_status_t dt_comm_p2p_timeout_(dt_comm_t *comm, const char *what, double waited) {
    /* ranks by global number, and the peer's own op as it published it */
    char msg[768];
    int peer = comm->members[1 - comm->rank];
    char key[512];
    snprintf(key, sizeof(key), "%s/status/%d", comm->prefix, 1 - comm->rank);
    const char *k = key;
    int ready = 0;
    void *v = NULL;
    size_t n = 0;
    double old = comm->timeout_s;
    dt_store_set_timeout(comm->store, 2.0);
    if (dt_store_check(comm->store, &k, 1, &ready) == DT_STATUS_OK && ready &&
        dt_store_get(comm->store, key, &v, &n) == DT_STATUS_OK)
        snprintf(msg, sizeof(msg), "%s on rank %d (%s) did not complete in %.1f s; rank %d is in %.*s", what,
                 comm->global_rank, comm->ops->name, waited, peer, (int)n, (char *)v);
    else
        snprintf(msg, sizeof(msg),
                 "%s on rank %d (%s) did not complete in %.1f s; rank %d made no report (not waiting on this "
                 "channel, or gone)",
                 what, comm->global_rank, comm->ops->name, waited, peer);
    free(v);
    dt_store_set_timeout(comm->store, old);
    return dt_error(DT_STATUS_TIMEOUT, "%s", msg);
}

void dt_comm_p2p_free_(dt_comm_t *comm) {
    if (!comm->p2p) return;
    for (int i = 0; i < 2 * comm->size; i++) dt_comm_free(comm->p2p[i]);
    free(comm->p2p);
    comm->p2p = NULL;
}
