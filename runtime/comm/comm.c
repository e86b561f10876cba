/*
 * comm.c - the communicator core: configuration from torchrun's environment,
 * backend choice (the one place that knows which backends exist), creation
 * through the store, sub-communicators, sequence numbers, requests and the
 * communication thread, and hang detection. Names, slices and the reduction
 * loops the host backends share are comm_types.c; host staging of device
 * buffers is comm_stage.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/cudalib.h" /* defines: dt_cudalib_sym, dt_cudalib_sym_checked */
#include "common/log.h"
#include "common/mem.h"
#include "common/torchenv.h" /* defines: dt_torchenv_read */
#include "runtime/comm/comm_impl.h"
#include "runtime/comm/flight.h"

/* ---- configuration ------------------------------------------------------------ */

dt_status_t dt_comm_config_from_env(dt_comm_config_t *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->device = -1;
    dt_torchenv_t env;
    DT_CHECK(dt_torchenv_read(&env));
    DT_CHECK(dt_torchenv_require_store(&env));
    cfg->store_host = env.master_addr;
    cfg->store_port = env.master_port;
    cfg->world_size = env.world_size;
    cfg->rank = env.rank;
    cfg->local_world_size = env.local_world_size;
    cfg->local_rank = env.local_rank;
    cfg->restart_round = env.restart_count;
    cfg->run_id = env.run_id;
    return DT_STATUS_OK;
}

static double env_timeout(void) {
    const char *v = getenv("DTRUN_COMM_TIMEOUT");
    if (v && *v) {
        char *end;
        double t = strtod(v, &end);
        if (*end == 0 && t > 0) return t;
        DT_LOG_WARN("DTRUN_COMM_TIMEOUT=\"%s\" is not a positive number; using 300 s", v);
    }
    return 300.0;
}

/* The NCCL communicator is in the CUDA library (common/cudalib.h), loaded here
 * the first time it is asked for. UNSUPPORTED with the loader's message when the
 * library cannot be loaded or has no NCCL. */
static dt_status_t nccl_backend(const dt_comm_backend_ops_t **out) {
    void *p;
    dt_status_t st = dt_cudalib_sym("dt_comm_nccl_ops", &p); /* "has no" names the ops, not the layout */
    if (st == DT_STATUS_OK)
        st = dt_cudalib_sym_checked("dt_comm_nccl_ops", "dt_comm_nccl_layout", DT_COMM_LAYOUT, "comm_impl.h", &p);
    if (st != DT_STATUS_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dt_error_detail());
        return dt_error(st, "communicator backend nccl: %s%s", why,
#ifdef DT_CUEMU
                        " (the CPU emulator has no NCCL)"
#else
                        ""
#endif
        );
    }
    *out = (const dt_comm_backend_ops_t *)p;
    return DT_STATUS_OK;
}

static dt_status_t choose_backend(const dt_comm_config_t *cfg, dt_comm_backend_t *out) {
    dt_comm_backend_t b = cfg->backend;
    const char *env = getenv("DTRUN_COMM");
    if (env && *env) {
        int e = dt_comm_backend_parse(env);
        if (e < 0)
            return dt_error(DT_STATUS_CONFIG,
                            "DTRUN_COMM=\"%s\": expected one of auto, shm, tcp, hier, nccl", env);
        b = (dt_comm_backend_t)e;
    }
    if ((unsigned)b > DT_COMM_BACKEND_NCCL)
        return dt_error(DT_STATUS_CONFIG, "communicator backend %d is unknown", (int)b);
    if (b == DT_COMM_BACKEND_AUTO) {
        int lws = cfg->local_world_size > 0 ? cfg->local_world_size : cfg->world_size;
        const dt_comm_backend_ops_t *nccl;
        /* a GPU buffer communicator: NCCL when the CUDA library has it (the device is
         * open, so the library is loaded already) */
        if (cfg->device >= 0 && nccl_backend(&nccl) == DT_STATUS_OK)
            b = DT_COMM_BACKEND_NCCL;
        else if (lws >= cfg->world_size)
            b = DT_COMM_BACKEND_SHM;
        else if (lws == 1)
            b = DT_COMM_BACKEND_TCP;
        else
            b = DT_COMM_BACKEND_HIER;
    }
    if (b == DT_COMM_BACKEND_NCCL) {
        const dt_comm_backend_ops_t *nccl;
        DT_CHECK(nccl_backend(&nccl));
    }
    *out = b;
    return DT_STATUS_OK;
}

static const dt_comm_backend_ops_t *backend_ops(dt_comm_backend_t b) {
    switch (b) {
    case DT_COMM_BACKEND_SHM: return &dt_comm_shm_ops;
    case DT_COMM_BACKEND_TCP: return &dt_comm_tcp_ops;
    case DT_COMM_BACKEND_HIER: return &dt_comm_hier_ops;
    case DT_COMM_BACKEND_NCCL: {
        const dt_comm_backend_ops_t *nccl = NULL;
        return nccl_backend(&nccl) == DT_STATUS_OK ? nccl : NULL;
    }
    default: return NULL;
    }
}

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

static void *comm_thread(void *arg) {
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
        req->flight_ = 0;
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

/* ---- creation ------------------------------------------------------------------- */

int dt_comm_rank(const dt_comm_t *comm) { return comm->rank; }
int dt_comm_size(const dt_comm_t *comm) { return comm->size; }
dt_comm_backend_t dt_comm_backend(const dt_comm_t *comm) { return comm->kind; }
uint64_t dt_comm_next_seq(const dt_comm_t *comm) { return comm->seq + 1; }

static char *sanitize(const char *s) {
    char *o = dt_xstrdup(s && *s ? s : "none");
    size_t n = strlen(o);
    if (n > 64) o[n = 64] = 0;
    for (size_t i = 0; i < n; i++) {
        char c = o[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
            o[i] = '_';
    }
    return o;
}

static void comm_release(dt_comm_t *comm) {
    if (!comm) return;
    if (comm->thread_started) {
        pthread_mutex_lock(&comm->mu);
        comm->stop = 1;
        pthread_cond_broadcast(&comm->cv_work);
        pthread_mutex_unlock(&comm->mu);
        pthread_join(comm->thread, NULL);
    }
    if (comm->be && comm->ops && comm->ops->free) comm->ops->free(comm);
    if (comm->store) dt_store_close(comm->store);
    pthread_mutex_destroy(&comm->mu);
    pthread_cond_destroy(&comm->cv_work);
    pthread_cond_destroy(&comm->cv_done);
    dt_mem_free(comm->stage_buf);
    free(comm->members);
    free(comm->store_host);
    free(comm->run_id);
    free(comm->tcp_addr);
    free(comm);
}

static dt_status_t create(const dt_comm_t *like, const char *id, const int *members, int nmembers, int my_index,
                         dt_comm_backend_t kind, int channel, dt_comm_t **out) {
    dt_status_t st;
    *out = NULL;
    dt_comm_t *comm = dt_xcalloc(1, sizeof(*comm));
    pthread_mutex_init(&comm->mu, NULL);
    pthread_cond_init(&comm->cv_work, NULL);
    pthread_cond_init(&comm->cv_done, NULL);
    comm->store_host = dt_xstrdup(like->store_host);
    comm->store_port = like->store_port;
    comm->run_id = dt_xstrdup(like->run_id);
    comm->restart_round = like->restart_round;
    comm->global_rank = like->global_rank;
    comm->global_size = like->global_size;
    comm->local_rank = like->local_rank;
    comm->local_world_size = like->local_world_size;
    comm->tcp_addr = like->tcp_addr ? dt_xstrdup(like->tcp_addr) : NULL;
    comm->tcp_conns = like->tcp_conns;
    comm->chunk_bytes = like->chunk_bytes;
    comm->device = like->device;
    comm->timeout_s = like->timeout_s;
    comm->publish_after_s = like->publish_after_s;
    snprintf(comm->id, sizeof(comm->id), "%s", id);
    snprintf(comm->prefix, sizeof(comm->prefix), "dtrun/comm/%s/%d/%.200s", comm->run_id, comm->restart_round, id);
    comm->rank = my_index;
    comm->size = nmembers;
    comm->members = dt_xmalloc(sizeof(int) * (size_t)nmembers);
    memcpy(comm->members, members, sizeof(int) * (size_t)nmembers);
    comm->kind = kind;
    comm->ops = backend_ops(kind);
    if (!comm->ops) {
        st = dt_error(DT_STATUS_UNSUPPORTED, "communicator backend %s is not built", dt_comm_backend_name(kind));
        goto out_release;
    }
    double connect_s = like->timeout_s < 60 ? 60 : like->timeout_s;
    /* A store with a token (the agent names its file in DTRUN_RDZV_TOKEN_FILE)
     * takes only clients that prove they hold it. */
    dt_store_token_t token;
    int have_token = 0;
    DT_CHECK_GOTO(dt_store_token_from_env(&token, &have_token), st, out_release);
    st = dt_store_connect_auth(comm->store_host, comm->store_port, connect_s,
                               have_token ? &token : NULL, &comm->store);
    memset(&token, 0, sizeof token);
    if (st != DT_STATUS_OK) goto out_release;
    comm->channel = channel;
    comm->running = channel; /* a channel's thread sets up its backend first (channel_setup) */
    if (!channel && (nmembers > 1 || kind == DT_COMM_BACKEND_NCCL))
        DT_CHECK_GOTO(comm->ops->init(comm), st, out_release);
    if (pthread_create(&comm->thread, NULL, comm_thread, comm) != 0) {
        st = dt_error(DT_STATUS_SYS, "comm %s: cannot start the communication thread", id);
        goto out_release;
    }
    comm->thread_started = 1;
    DT_LOG_DEBUG("comm %s: rank %d of %d, backend %s", id, my_index, nmembers, comm->ops->name);
    *out = comm;
    return DT_STATUS_OK;

out_release:
    {
        char keep[768];
        snprintf(keep, sizeof(keep), "%s", dt_error_detail());
        comm_release(comm);
        dt_error(st, "%s", keep);
    }
    return st;
}

dt_status_t dt_comm_create_group_(const dt_comm_t *like, const char *id, const int *members, int nmembers,
                                  int my_index, dt_comm_backend_t kind, dt_comm_t **out) {
    return create(like, id, members, nmembers, my_index, kind, 0, out);
}

dt_status_t dt_comm_create_channel_(const dt_comm_t *like, const char *id, const int members[2], int my_index,
                                    dt_comm_backend_t kind, dt_comm_t **out) {
    DT_CHECK(create(like, id, members, 2, my_index, kind, 1, out));
    (*out)->stage_dev = like->stage_dev; /* set only for host backends given CUDA buffers */
    return DT_STATUS_OK;
}

/* Host staging for a communicator that runs on host memory, given CUDA
 * buffers (comm.h, stage_dev). Set before the first op is issued. Not
 * inherited by dt_comm_create_group_: hier's own sub-communicators get host
 * buffers; dt_comm_split passes it on. */
static void set_staging(dt_comm_t *comm, dt_device_t *dev) {
    if (dev && dev->kind == DT_DEVICE_CUDA && comm->kind != DT_COMM_BACKEND_NCCL) comm->stage_dev = dev;
}

dt_status_t dt_comm_init(const dt_comm_config_t *cfg, dt_comm_t **out) {
    if (!cfg || !out) return dt_error(DT_STATUS_INVALID, "dt_comm_init: NULL argument");
    *out = NULL;
    if (!cfg->store_host || !*cfg->store_host || cfg->store_port <= 0 || cfg->store_port > 65535)
        return dt_error(DT_STATUS_CONFIG, "communicator: store endpoint %s:%d is invalid",
                        cfg->store_host ? cfg->store_host : "(none)", cfg->store_port);
    if (cfg->world_size < 1 || cfg->rank < 0 || cfg->rank >= cfg->world_size)
        return dt_error(DT_STATUS_CONFIG, "communicator: rank %d / world size %d is invalid", cfg->rank,
                        cfg->world_size);
    int lws = cfg->local_world_size > 0 ? cfg->local_world_size : cfg->world_size;
    if (lws > cfg->world_size || cfg->world_size % lws != 0)
        return dt_error(DT_STATUS_CONFIG, "communicator: local world size %d does not divide world size %d", lws,
                        cfg->world_size);
    if (cfg->tcp_conns < 0 || cfg->tcp_conns > 8)
        return dt_error(DT_STATUS_CONFIG, "communicator: tcp_conns %d outside [1, 8]", cfg->tcp_conns);
    dt_comm_backend_t kind = DT_COMM_BACKEND_SHM;
    DT_CHECK(choose_backend(cfg, &kind));
    const dt_device_t *sd = cfg->stage_dev;
    if (sd && sd->kind == DT_DEVICE_CUDA && (!sd->ops || !sd->ops->copy))
        return dt_error(DT_STATUS_CONFIG, "communicator: stage_dev (a %s device) has no copy operation",
                        dt_device_kind_name(sd->kind));

    dt_comm_t like;
    memset(&like, 0, sizeof(like));
    like.store_host = (char *)cfg->store_host;
    like.store_port = cfg->store_port;
    char *run_id = sanitize(cfg->run_id);
    like.run_id = run_id;
    like.restart_round = cfg->restart_round;
    like.global_rank = cfg->rank;
    like.global_size = cfg->world_size;
    like.local_rank = cfg->local_rank;
    like.local_world_size = lws;
    const char *addr = cfg->tcp_addr ? cfg->tcp_addr : getenv("DTRUN_COMM_ADDR");
    like.tcp_addr = addr && *addr ? (char *)addr : NULL;
    like.tcp_conns = cfg->tcp_conns;
    if (!like.tcp_conns) {
        const char *c = getenv("DTRUN_COMM_TCP_CONNS");
        like.tcp_conns = c && atoi(c) >= 1 && atoi(c) <= 8 ? atoi(c) : 1;
    }
    like.chunk_bytes = cfg->chunk_bytes;
    like.device = cfg->device;
    like.timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : env_timeout();
    like.publish_after_s = like.timeout_s / 4 < 5.0 ? like.timeout_s / 4 : 5.0;

    /* The first communicator of a process is "0"; later dt_comm_init calls (the
     * same number on every rank) get their own names, segments and keys. */
    static _Atomic int inits = 0;
    int nth = atomic_fetch_add(&inits, 1);
    char id[32];
    if (nth == 0)
        snprintf(id, sizeof(id), "0");
    else
        snprintf(id, sizeof(id), "i%d", nth);
    int *members = dt_xmalloc(sizeof(int) * (size_t)cfg->world_size);
    for (int i = 0; i < cfg->world_size; i++) members[i] = i;
    dt_status_t st = dt_comm_create_group_(&like, id, members, cfg->world_size, cfg->rank, kind, out);
    if (st == DT_STATUS_OK) set_staging(*out, cfg->stage_dev);
    free(members);
    free(run_id);
    return st;
}

typedef struct split_entry {
    int color, key, rank;
} split_entry_t;

static int split_cmp(const void *a, const void *b) {
    const split_entry_t *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

dt_status_t dt_comm_split(dt_comm_t *parent, int color, int key, dt_comm_t **out) {
    if (!parent || !out) return dt_error(DT_STATUS_INVALID, "dt_comm_split: NULL argument");
    *out = NULL;
    int k = ++parent->splits;
    char val[64];
    snprintf(val, sizeof(val), "%d %d", color, key);
    DT_CHECK(dt_comm_kv_set_(parent, val, strlen(val), "split%d/%d", k, parent->rank));
    split_entry_t *e = dt_xcalloc((size_t)parent->size, sizeof(*e));
    dt_status_t st = DT_STATUS_OK;
    for (int r = 0; r < parent->size; r++) {
        char *v = NULL;
        DT_CHECK_GOTO(dt_comm_kv_get_(parent, &v, NULL, "split%d/%d", k, r), st, out_free_entries);
        int ok = sscanf(v, "%d %d", &e[r].color, &e[r].key) == 2;
        free(v);
        if (!ok) {
            st = dt_error(DT_STATUS_PROTOCOL, "dt_comm_split: malformed entry of rank %d", r);
            goto out_free_entries;
        }
        e[r].rank = r;
    }
    if (color < 0) goto out_free_entries;
    int n = 0;
    for (int r = 0; r < parent->size; r++)
        if (e[r].color == color) e[n++] = e[r];
    qsort(e, (size_t)n, sizeof(*e), split_cmp);
    int *members = dt_xmalloc(sizeof(int) * (size_t)n);
    int me = -1, one_node = 1;
    int lws = parent->local_world_size;
    for (int i = 0; i < n; i++) {
        members[i] = parent->members[e[i].rank];
        if (e[i].rank == parent->rank) me = i;
        if (members[i] / lws != members[0] / lws) one_node = 0;
    }
    dt_comm_backend_t kind = parent->kind;
    if (kind != DT_COMM_BACKEND_NCCL) {
        if (one_node)
            kind = DT_COMM_BACKEND_SHM;
        else if (kind == DT_COMM_BACKEND_HIER)
            kind = DT_COMM_BACKEND_TCP; /* a group across nodes: ring (hier needs whole nodes) */
    }
    char id[200];
    snprintf(id, sizeof(id), "%.160s.s%d.%d", parent->id, k, color);
    st = dt_comm_create_group_(parent, id, members, n, me, kind, out);
    if (st == DT_STATUS_OK) set_staging(*out, parent->stage_dev);
    free(members);
out_free_entries:
    free(e);
    return st;
}

void dt_comm_free(dt_comm_t *comm) {
    if (!comm) return;
    dt_comm_p2p_free_(comm);
    /* Let pending requests finish (each is bounded by the timeout). */
    pthread_mutex_lock(&comm->mu);
    while (comm->head || comm->running) pthread_cond_wait(&comm->cv_done, &comm->mu);
    pthread_mutex_unlock(&comm->mu);
    comm_release(comm);
}
