/*
 * comm.c - the communicator's op engine: store helpers, sequence numbers,
 * requests (issue, test, wait) and the communication thread, hang
 * detection, and the collectives' entry points. Configuration, backend
 * choice, creation, splitting and freeing are comm_life.c; names, slices and
 * the reduction loops the host backends share are comm_types.c; host staging
 * of device buffers is comm_stage.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "runtime/comm/comm_impl.h"
#include "runtime/comm/flight.h"

/* ---- store helpers ------------------------------------------------------------ */

dt_status_t dt_comm_kv_set_(dt_comm_t *comm, const void *val, size_t len, const char *fmt, ...) {
    char key[700], sub[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sub, sizeof(sub), fmt, ap);
    va_end(ap);
    snprintf(key, sizeof(key), "%s/%s", comm->prefix, sub);
    return dt_store_set(comm->store, key, val, len);
}

dt_status_t dt_comm_kv_get_(dt_comm_t *comm, char **val, size_t *len, const char *fmt, ...) {
    char key[700], sub[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sub, sizeof(sub), fmt, ap);
    va_end(ap);
    snprintf(key, sizeof(key), "%s/%s", comm->prefix, sub);
    void *v = NULL;
    size_t n = 0;
    DT_CHECK(dt_store_get(comm->store, key, &v, &n));
    char *s = dt_xmalloc(n + 1);
    if (n) memcpy(s, v, n);
    s[n] = 0;
    free(v);
    *val = s;
    if (len) *len = n;
    return DT_STATUS_OK;
}

/* ---- hang detection ------------------------------------------------------------ */

void dt_comm_describe_(const dt_comm_req_t *req, char *buf, size_t len) {
    if (req->op_ == DT_COMM_OP_SEND || req->op_ == DT_COMM_OP_RECV) {
        /* on a channel (comm_p2p.c): the peer is the other member, by global rank */
        const dt_comm_t *ch = req->comm_;
        int peer = ch && ch->size == 2 ? ch->members[1 - ch->rank] : -1;
        snprintf(buf, len, "%s #%" PRIu64 " %s rank %d (count %zu, %s)", dt_comm_op_name(req->op_), req->seq_,
                 req->op_ == DT_COMM_OP_SEND ? "to" : "from", peer, req->count_, dt_comm_dtype_name(req->dtype_));
    } else if (req->op_ == DT_COMM_OP_BARRIER)
        snprintf(buf, len, "barrier #%" PRIu64, req->seq_);
    else
        snprintf(buf, len, "%s #%" PRIu64 " (count %zu, %s%s%s)", dt_comm_op_name(req->op_),
                 req->seq_, req->count_, dt_comm_dtype_name(req->dtype_),
                 req->op_ == DT_COMM_OP_ALL_REDUCE || req->op_ == DT_COMM_OP_REDUCE_SCATTER ? ", " : "",
                 req->op_ == DT_COMM_OP_ALL_REDUCE || req->op_ == DT_COMM_OP_REDUCE_SCATTER
                     ? dt_comm_redop_name(req->redop_)
                     : "");
}

static void publish_status(dt_comm_t *comm) {
    char what[200];
    dt_comm_describe_(comm->cur, what, sizeof(what));
    dt_status_t st = dt_comm_kv_set_(comm, what, strlen(what), "status/%d", comm->rank);
    if (st != DT_STATUS_OK) DT_LOG_WARN("comm %s: could not publish status: %s", comm->id, dt_error_detail());
    comm->published = 1;
}

dt_status_t dt_comm_tick_slow_(dt_comm_t *comm) {
    if (!comm->cur) return DT_STATUS_OK;
    double waited = (double)(dt_now_ns() - comm->op_start_ns) * 1e-9;
    if (!comm->published && waited >= comm->publish_after_s) publish_status(comm);
    if (waited < comm->timeout_s) return DT_STATUS_OK;

    /* Timed out: name this op and what every rank published. */
    char what[200], msg[768];
    dt_comm_describe_(comm->cur, what, sizeof(what));
    if (comm->channel) return dt_comm_p2p_timeout_(comm, what, waited); /* comm_p2p.c */
    int off = snprintf(msg, sizeof(msg), "%s on rank %d (of %d, %s) did not complete in %.1f s; ranks:",
                       what, comm->rank, comm->size, comm->ops->name, waited);
    double old = comm->timeout_s;
    dt_store_set_timeout(comm->store, 2.0);
    for (int r = 0; r < comm->size && off < (int)sizeof(msg) - 1; r++) {
        char key[512];
        snprintf(key, sizeof(key), "%s/status/%d", comm->prefix, r);
        const char *k = key;
        int ready = 0;
        void *v = NULL;
        size_t n = 0;
        const char *sep = r ? ";" : "";
        if (r == comm->rank) {
            off += snprintf(msg + off, sizeof(msg) - off, "%s %d in %s", sep, r, what);
        } else if (dt_store_check(comm->store, &k, 1, &ready) == DT_STATUS_OK && ready &&
                   dt_store_get(comm->store, key, &v, &n) == DT_STATUS_OK) {
            off += snprintf(msg + off, sizeof(msg) - off, "%s %d in %.*s", sep, r, (int)n, (char *)v);
            free(v);
        } else {
            off += snprintf(msg + off, sizeof(msg) - off, "%s %d no report (not waiting in a collective, or gone)",
                            sep, r);
        }
    }
    dt_store_set_timeout(comm->store, old);
    return dt_error(DT_STATUS_TIMEOUT, "%s", msg);
}

/* ---- requests and the communication thread ------------------------------------- */

/* Runs one op on this thread: run (host backends), or start then finish
 * (NCCL on a point-to-point channel, whose ops run on the channel's thread). */
static dt_status_t run_op(dt_comm_t *comm, dt_comm_req_t *req) {
    if (comm->stage_dev) return dt_comm_run_staged_(comm, req);
    if (comm->ops->run) return comm->ops->run(comm, req);
    DT_CHECK(comm->ops->start(comm, req));
    int done = 0;
    return comm->ops->finish(comm, req, 1, &done);
}

static void execute(dt_comm_t *comm, dt_comm_req_t *req) {
    dt_status_t st;
    if (atomic_load(&comm->broken)) {
        char what[200];
        dt_comm_describe_(req, what, sizeof(what));
        if (comm->setup_status != DT_STATUS_OK) /* a channel whose peer never came */
            st = dt_error(comm->setup_status, "%s on rank %d: %s", what, comm->global_rank, comm->broken_detail);
        else
            st = dt_error(DT_STATUS_CANCELED, "%s not run: the communicator failed earlier: %s", what,
                          comm->broken_detail);
    } else {
        comm->cur = req;
        comm->published = 0;
        comm->op_start_ns = dt_now_ns();
        dt_comm_flight_state_(req, DT_FLIGHT_STARTED);
        st = run_op(comm, req);
        comm->cur = NULL;
        if (st != DT_STATUS_OK) {
            snprintf(comm->broken_detail, sizeof(comm->broken_detail), "%s", dt_error_detail());
            atomic_store(&comm->broken, 1);
        }
    }
    req->status_ = st;
    dt_comm_flight_state_(req, st == DT_STATUS_OK ? DT_FLIGHT_DONE : DT_FLIGHT_FAILED);
    if (st != DT_STATUS_OK) snprintf(req->detail_, sizeof(req->detail_), "%s", dt_error_detail());
}

/* A channel's backend meets its peer's here, on the channel's thread, within
 * the communicator's timeout; ops issued meanwhile queue (running is 1). */
static void channel_setup(dt_comm_t *comm) {
    dt_store_set_timeout(comm->store, comm->timeout_s);
    dt_status_t st = comm->ops->init(comm);
    if (st == DT_STATUS_OK) return;
    int peer = comm->members[1 - comm->rank];
    char why[512];
    snprintf(why, sizeof(why), "%s", dt_error_detail());
    if (st == DT_STATUS_TIMEOUT)
        snprintf(comm->broken_detail, sizeof(comm->broken_detail),
                 "rank %d did not set up its end of the channel within %.1f s (%s)", peer, comm->timeout_s, why);
    else
        snprintf(comm->broken_detail, sizeof(comm->broken_detail), "setting up the channel with rank %d failed: %s",
                 peer, why);
    comm->setup_status = st;
    atomic_store(&comm->broken, 1);
}

void *dt_comm_thread_(void *arg) {
    dt_comm_t *comm = arg;
    pthread_setname_np(pthread_self(), comm->channel ? "dtp2p" : "dtcomm");
    if (comm->channel) {
        channel_setup(comm);
        pthread_mutex_lock(&comm->mu);
        comm->running = 0;
        pthread_cond_broadcast(&comm->cv_done);
        pthread_mutex_unlock(&comm->mu);
    }
    pthread_mutex_lock(&comm->mu);
    for (;;) {
        while (!comm->stop && (!comm->head || comm->running)) pthread_cond_wait(&comm->cv_work, &comm->mu);
        if (!comm->head) break; /* stop and nothing pending */
        dt_comm_req_t *req = comm->head;
        comm->head = req->next_;
        if (!comm->head) comm->tail = NULL;
        comm->running = 1;
        pthread_mutex_unlock(&comm->mu);
        execute(comm, req);
        pthread_mutex_lock(&comm->mu);
        comm->running = 0;
        atomic_store_explicit(&req->done_, 1, memory_order_release);
        pthread_cond_broadcast(&comm->cv_done);
        pthread_cond_broadcast(&comm->cv_work);
    }
    pthread_mutex_unlock(&comm->mu);
    return NULL;
}

static dt_status_t check_args(dt_comm_t *comm, dt_comm_req_t *req) {
    if (!comm) return dt_error(DT_STATUS_INVALID, "communicator is NULL");
    if (!req) return dt_error(DT_STATUS_INVALID, "request is NULL");
    if (req->dtype_ != DT_COMM_F32 && req->dtype_ != DT_COMM_BF16)
        return dt_error(DT_STATUS_INVALID, "%s: unknown dtype %d", dt_comm_op_name(req->op_), (int)req->dtype_);
    if ((unsigned)req->redop_ > DT_COMM_MAX)
        return dt_error(DT_STATUS_INVALID, "%s: unknown reduction %d", dt_comm_op_name(req->op_), (int)req->redop_);
    if (req->op_ == DT_COMM_OP_REDUCE_SCATTER && req->redop_ == DT_COMM_MAX)
        return dt_error(DT_STATUS_UNSUPPORTED, "reduce_scatter supports sum and avg, not max");
    size_t mult = req->op_ == DT_COMM_OP_ALL_GATHER ? (size_t)comm->size : 1;
    if (req->count_ > (SIZE_MAX / 8) / mult)
        return dt_error(DT_STATUS_INVALID, "%s: count %zu is too large", dt_comm_op_name(req->op_), req->count_);
    if (req->count_ > 0 && req->op_ != DT_COMM_OP_BARRIER) {
        if (!req->recv_ || (req->op_ != DT_COMM_OP_BROADCAST && !req->send_))
            return dt_error(DT_STATUS_INVALID, "%s: NULL buffer with count %zu", dt_comm_op_name(req->op_),
                            req->count_);
    }
    if ((req->op_ == DT_COMM_OP_SEND || req->op_ == DT_COMM_OP_RECV) && !comm->channel)
        return dt_error(DT_STATUS_INVALID, "%s: not a point-to-point channel (use dt_comm_%s)",
                        dt_comm_op_name(req->op_), dt_comm_op_name(req->op_));
    if (req->op_ == DT_COMM_OP_BROADCAST && (req->root_ < 0 || req->root_ >= comm->size))
        return dt_error(DT_STATUS_INVALID, "broadcast: root %d outside [0, %d)", req->root_, comm->size);
    return DT_STATUS_OK;
}

/* Ops that need no backend: world size 1 and count 0. Returns 1 when done
 * (then req->status_ says how; staged buffers are copied on the device). */
static int trivial(dt_comm_t *comm, dt_comm_req_t *req) {
    if (comm->kind == DT_COMM_BACKEND_NCCL || comm->channel) return 0; /* a 0-count message is still matched */
    if (req->op_ == DT_COMM_OP_BARRIER) return comm->size == 1;
    if (req->count_ == 0) return 1;
    if (comm->size != 1) return 0;
    size_t bytes = req->count_ * dt_comm_dtype_size(req->dtype_);
    if (req->op_ == DT_COMM_OP_BROADCAST || req->recv_ == req->send_) return 1;
    if (!comm->stage_dev) {
        memmove(req->recv_, req->send_, bytes);
        return 1;
    }
    dt_status_t st = dt_comm_stage_copy_(comm, req, req->recv_, req->send_, bytes, DT_COPY_DEVICE_TO_DEVICE);
    if (st != DT_STATUS_OK) {
        req->status_ = st;
        snprintf(req->detail_, sizeof(req->detail_), "%s", dt_error_detail());
    }
    return 1;
}

dt_status_t dt_comm_issue_(dt_comm_t *comm, dt_comm_req_t *req, int blocking) {
    dt_status_t st = check_args(comm, req);
    if (st != DT_STATUS_OK) return st;
    if (dt_comm_flight_skip_(comm, req)) { /* the test hook (flight.h): done, unnumbered */
        req->comm_ = comm;
        req->status_ = DT_STATUS_OK;
        req->flight_ = req->trace_issue_ns_ = 0;
        atomic_store(&req->done_, 1);
        return DT_STATUS_OK;
    }
    req->comm_ = comm;
    req->next_ = NULL;
    req->status_ = DT_STATUS_OK;
    req->detail_[0] = 0;
    req->backend_ = NULL;
    atomic_store(&req->done_, 0);
    req->seq_ = ++comm->seq;
    dt_comm_flight_issue_(comm, req);

    if (comm->ops->start && !comm->channel) {
        if (atomic_load(&comm->broken)) {
            execute(comm, req); /* fails with the earlier error */
            atomic_store(&req->done_, 1);
            return DT_STATUS_OK;
        }
        comm->cur = req;
        dt_comm_flight_state_(req, DT_FLIGHT_STARTED);
        st = comm->ops->start(comm, req);
        comm->cur = NULL;
        if (st != DT_STATUS_OK) {
            req->status_ = st;
            snprintf(req->detail_, sizeof(req->detail_), "%s", dt_error_detail());
            snprintf(comm->broken_detail, sizeof(comm->broken_detail), "%s", dt_error_detail());
            atomic_store(&comm->broken, 1);
            dt_comm_flight_state_(req, DT_FLIGHT_FAILED);
            atomic_store(&req->done_, 1);
        }
        return DT_STATUS_OK;
    }

    pthread_mutex_lock(&comm->mu);
    if (blocking && !comm->head && !comm->running) {
        /* Nothing pending: run on the caller's thread (no hand-off latency). */
        comm->running = 1;
        pthread_mutex_unlock(&comm->mu);
        if (trivial(comm, req)) dt_comm_flight_state_(req, DT_FLIGHT_DONE);
        else execute(comm, req);
        pthread_mutex_lock(&comm->mu);
        comm->running = 0;
        atomic_store_explicit(&req->done_, 1, memory_order_release);
        if (comm->head) pthread_cond_broadcast(&comm->cv_work); /* an async op queued meanwhile */
        pthread_mutex_unlock(&comm->mu);
        return DT_STATUS_OK;
    }
    if (!comm->head && !comm->running && trivial(comm, req)) {
        dt_comm_flight_state_(req, DT_FLIGHT_DONE);
        atomic_store_explicit(&req->done_, 1, memory_order_release);
        pthread_mutex_unlock(&comm->mu);
        return DT_STATUS_OK;
    }
    if (comm->tail)
        comm->tail->next_ = req;
    else
        comm->head = req;
    comm->tail = req;
    pthread_cond_signal(&comm->cv_work);
    pthread_mutex_unlock(&comm->mu);
    return DT_STATUS_OK;
}

/* A request of a start/finish backend (NCCL) ended: record its status; a
 * failure breaks the communicator as it does for host backends (execute). */
static void finished(dt_comm_t *comm, dt_comm_req_t *req, dt_status_t st) {
    req->status_ = st;
    dt_comm_flight_state_(req, st == DT_STATUS_OK ? DT_FLIGHT_DONE : DT_FLIGHT_FAILED);
    if (st != DT_STATUS_OK) {
        snprintf(req->detail_, sizeof(req->detail_), "%s", dt_error_detail());
        if (!atomic_load(&comm->broken)) {
            snprintf(comm->broken_detail, sizeof(comm->broken_detail), "%s", req->detail_);
            atomic_store(&comm->broken, 1);
        }
    }
    atomic_store(&req->done_, 1);
}

dt_status_t dt_comm_test(dt_comm_req_t *req, int *done) {
    if (!req || !req->comm_) return dt_error(DT_STATUS_INVALID, "dt_comm_test: request was not issued");
    dt_comm_t *comm = req->comm_;
    if (comm->ops->finish && !comm->channel && !atomic_load(&req->done_)) {
        int d = 0;
        dt_status_t st = comm->ops->finish(comm, req, 0, &d);
        if (st != DT_STATUS_OK || d) finished(comm, req, st);
    }
    *done = atomic_load_explicit(&req->done_, memory_order_acquire);
    return DT_STATUS_OK;
}

dt_status_t dt_comm_wait(dt_comm_req_t *req) {
    if (!req || !req->comm_) return dt_error(DT_STATUS_INVALID, "dt_comm_wait: request was not issued");
    dt_comm_t *comm = req->comm_;
    if (comm->ops->finish && !comm->channel && !atomic_load(&req->done_)) {
        int d = 0;
        finished(comm, req, comm->ops->finish(comm, req, 1, &d));
    }
    for (int i = 0; i < 4000 && !atomic_load_explicit(&req->done_, memory_order_acquire); i++)
        dt_comm_cpu_relax();
    if (!atomic_load_explicit(&req->done_, memory_order_acquire)) {
        pthread_mutex_lock(&comm->mu);
        while (!atomic_load_explicit(&req->done_, memory_order_acquire))
            pthread_cond_wait(&comm->cv_done, &comm->mu);
        pthread_mutex_unlock(&comm->mu);
    }
    if (req->status_ != DT_STATUS_OK) return dt_error(req->status_, "%s", req->detail_);
    return DT_STATUS_OK;
}

static void fill(dt_comm_req_t *req, dt_comm_op_t op, const void *send, void *recv, size_t count,
                 dt_comm_dtype_t dtype, dt_comm_redop_t redop, int root) {
    req->op_ = op;
    req->send_ = send;
    req->recv_ = recv;
    req->count_ = count;
    req->dtype_ = dtype;
    req->redop_ = redop;
    req->root_ = root;
    req->comm_ = NULL;
}

dt_status_t dt_comm_all_reduce_async(dt_comm_t *comm, const void *send, void *recv, size_t count,
                                     dt_comm_dtype_t dtype, dt_comm_redop_t redop, dt_comm_req_t *req) {
    if (!req) return dt_error(DT_STATUS_INVALID, "request is NULL");
    fill(req, DT_COMM_OP_ALL_REDUCE, send, recv, count, dtype, redop, 0);
    return dt_comm_issue_(comm, req, 0);
}

dt_status_t dt_comm_reduce_scatter_async(dt_comm_t *comm, const void *send, void *recv, size_t count,
                                         dt_comm_dtype_t dtype, dt_comm_redop_t redop,
                                         dt_comm_req_t *req) {
    if (!req) return dt_error(DT_STATUS_INVALID, "request is NULL");
    fill(req, DT_COMM_OP_REDUCE_SCATTER, send, recv, count, dtype, redop, 0);
    return dt_comm_issue_(comm, req, 0);
}

dt_status_t dt_comm_all_gather_async(dt_comm_t *comm, const void *send, void *recv, size_t count,
                                     dt_comm_dtype_t dtype, dt_comm_req_t *req) {
    if (!req) return dt_error(DT_STATUS_INVALID, "request is NULL");
    fill(req, DT_COMM_OP_ALL_GATHER, send, recv, count, dtype, DT_COMM_SUM, 0);
    return dt_comm_issue_(comm, req, 0);
}

dt_status_t dt_comm_broadcast_async(dt_comm_t *comm, void *buf, size_t count, dt_comm_dtype_t dtype,
                                    int root, dt_comm_req_t *req) {
    if (!req) return dt_error(DT_STATUS_INVALID, "request is NULL");
    fill(req, DT_COMM_OP_BROADCAST, buf, buf, count, dtype, DT_COMM_SUM, root);
    return dt_comm_issue_(comm, req, 0);
}

dt_status_t dt_comm_barrier_async(dt_comm_t *comm, dt_comm_req_t *req) {
    if (!req) return dt_error(DT_STATUS_INVALID, "request is NULL");
    fill(req, DT_COMM_OP_BARRIER, NULL, NULL, 0, DT_COMM_F32, DT_COMM_SUM, 0);
    return dt_comm_issue_(comm, req, 0);
}

static dt_status_t blocking(dt_comm_t *comm, dt_comm_op_t op, const void *send, void *recv, size_t count,
                            dt_comm_dtype_t dtype, dt_comm_redop_t redop, int root) {
    dt_comm_req_t req;
    fill(&req, op, send, recv, count, dtype, redop, root);
    DT_CHECK(dt_comm_issue_(comm, &req, 1));
    return dt_comm_wait(&req);
}

dt_status_t dt_comm_all_reduce(dt_comm_t *comm, const void *send, void *recv, size_t count,
                               dt_comm_dtype_t dtype, dt_comm_redop_t redop) {
    return blocking(comm, DT_COMM_OP_ALL_REDUCE, send, recv, count, dtype, redop, 0);
}

dt_status_t dt_comm_reduce_scatter(dt_comm_t *comm, const void *send, void *recv, size_t count,
                                   dt_comm_dtype_t dtype, dt_comm_redop_t redop) {
    return blocking(comm, DT_COMM_OP_REDUCE_SCATTER, send, recv, count, dtype, redop, 0);
}

dt_status_t dt_comm_all_gather(dt_comm_t *comm, const void *send, void *recv, size_t count,
                               dt_comm_dtype_t dtype) {
    return blocking(comm, DT_COMM_OP_ALL_GATHER, send, recv, count, dtype, DT_COMM_SUM, 0);
}

dt_status_t dt_comm_broadcast(dt_comm_t *comm, void *buf, size_t count, dt_comm_dtype_t dtype, int root) {
    return blocking(comm, DT_COMM_OP_BROADCAST, buf, buf, count, dtype, DT_COMM_SUM, root);
}

dt_status_t dt_comm_barrier(dt_comm_t *comm) {
    return blocking(comm, DT_COMM_OP_BARRIER, NULL, NULL, 0, DT_COMM_F32, DT_COMM_SUM, 0);
}

dt_status_t dt_comm_run_sub_(dt_comm_t *sub, dt_comm_op_t op, const void *send, void *recv, size_t count,
                             dt_comm_dtype_t dtype, dt_comm_redop_t redop, int root) {
    return blocking(sub, op, send, recv, count, dtype, redop, root);
}
