/*
 * comm_nccl.c - NCCL backend for CUDA buffers. Built into the CUDA library
 * (libdtrun_cuda.so) with CUDA's headers, never into dtrun: comm.c finds
 * dt_comm_nccl_ops through common/cudalib.h; its calls into comm.c, the store and
 * common/ resolve against the dtrun binary that loaded it (linked -rdynamic).
 *
 * Rank 0 makes the unique id and publishes it in the store; every rank selects
 * its device (comm->device, else LOCAL_RANK) with cudaSetDevice before
 * ncclCommInitRank (and again before each op: the issuing thread may not be the
 * one that created the communicator). Averages use ncclAvg. reduce_scatter
 * with a count the world size does not divide runs as one ncclReduce per slice
 * in a group. Errors of CUDA and NCCL become DT_STATUS_CUDA / DT_STATUS_NCCL
 * with NCCL's own text: the result's name (ncclGetErrorString) and the detail
 * of what failed (ncclGetLastError).
 *
 * Ordering. Ops run on the communicator's own stream (non-blocking, so it never
 * waits for unrelated work implicitly). Before each op an event recorded on the
 * legacy default stream (cudaStreamLegacy) is waited for on that stream. The
 * ASSUMPTION that makes this order the op after the compute that produced its
 * input: the CUDA device's compute stream is a blocking stream (created by
 * cudaStreamCreate with default flags, not cudaStreamNonBlocking), and the
 * legacy default stream synchronises with every blocking stream of the device,
 * so the event completes only after all compute queued so far. A
 * cudaStreamNonBlocking compute stream would break this silently. After the op
 * each request records its own event on the communicator's stream;
 * dt_comm_wait/test poll it (with the hang detector running), so work the
 * caller queues after dt_comm_wait sees the result.
 *
 * Point to point (comm_p2p.c): a channel is a 2-rank NCCL communicator whose
 * ops run on the channel's thread (comm.c: start, then finish blocking). A
 * message first exchanges (count, dtype, seq) both ways (ncclSend + ncclRecv of
 * 4 uint64 in a group, through a small device buffer), compares them on the
 * host (waiting with the hang detector), then ncclSend / ncclRecv the payload.
 *
 * bf16: NCCL reduces bf16 in bf16 steps (each hop rounds), not the "fp32
 * accumulate, round once" of the host backends (comm.h); results can differ
 * from them in the last bit.
 *
 * Watchdog (comm_watchdog.h): every communicator has one; each op's completion
 * event is tracked from its enqueue, and an op still pending after the timeout,
 * or an asynchronous NCCL error (ncclCommGetAsyncError), aborts the NCCL
 * communicator (ncclCommAbort releases the kernels stuck on the stream) even
 * when nobody waits in dt_comm_wait; the op, and every later one, then fails
 * with the watchdog's detail. be->mu orders the abort against the calls that
 * use be->nc (enqueue, the asynchronous error check).
 *
 * Compiled and linked in CI; runs only on a GPU machine (scripts/gpu_check.sh).
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/mem.h"
#include "runtime/comm/comm_impl.h"
#include "runtime/comm/comm_watchdog.h"

typedef struct nccl_be {
    ncclComm_t nc;
    cudaStream_t stream;
    cudaEvent_t ready;
    float *scratch; /* device float for barrier */
    uint64_t *hdr;  /* device: point-to-point headers, mine [0..3] and the peer's [4..7] */
    uint64_t *hdr_host; /* pinned, the same 8 (pageable memory would make the copies block) */
    int device;
    pthread_mutex_t mu;    /* be->nc against the watchdog's abort */
    dt_comm_watchdog_t wd;
    dt_comm_t *comm;
} nccl_be_t;

#define CUDA_TRY(call, what)                                                                        \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess)                                                                      \
            return dt_error(DT_STATUS_CUDA, "nccl comm: %s: %s", what, cudaGetErrorString(e_));     \
    } while (0)
#define NCCL_TRY(call, what)                                                                        \
    do {                                                                                            \
        ncclResult_t r_ = (call);                                                                   \
        if (r_ != ncclSuccess) return nccl_error(r_, what);                                         \
    } while (0)

/* NCCL's result name and its last error message (the detail: which peer, which
 * transport, what CUDA said). */
static dt_status_t nccl_error(ncclResult_t r, const char *what) {
    const char *last = ncclGetLastError(NULL);
    return dt_error(DT_STATUS_NCCL, "nccl comm: %s: %s%s%s", what, ncclGetErrorString(r),
                    last && *last ? ": " : "", last && *last ? last : "");
}

/* Aborts the NCCL communicator once (the watchdog, a timeout, an asynchronous error). */
static void abort_nc(nccl_be_t *be) {
    pthread_mutex_lock(&be->mu);
    if (be->nc) ncclCommAbort(be->nc);
    be->nc = NULL;
    pthread_mutex_unlock(&be->mu);
}

/* The asynchronous error of the communicator, under be->mu (ncclSuccess once aborted). */
static ncclResult_t async_error(nccl_be_t *be) {
    ncclResult_t r = ncclSuccess;
    pthread_mutex_lock(&be->mu);
    if (be->nc) ncclCommGetAsyncError(be->nc, &r);
    pthread_mutex_unlock(&be->mu);
    return r;
}

/* ---- the watchdog's hooks (its thread) ---- */

static int wd_poll(void *ctx, dt_comm_req_t *req, char *detail, size_t len) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)req->backend_);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) return 0;
    char what[200];
    dt_comm_describe_(req, what, sizeof what);
    snprintf(detail, len, "%s: %s", what, cudaGetErrorString(e));
    return -1;
}

static int wd_async(void *ctx, char *detail, size_t len) {
    ncclResult_t r = async_error(ctx);
    if (r == ncclSuccess) return 0;
    const char *last = ncclGetLastError(NULL);
    snprintf(detail, len, "NCCL %s%s%s", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
    return 1;
}

static void wd_abort(void *ctx, const char *detail) {
    nccl_be_t *be = ctx;
    abort_nc(be);
    if (!atomic_load(&be->comm->broken)) {
        snprintf(be->comm->broken_detail, sizeof be->comm->broken_detail, "watchdog: %s", detail);
        atomic_store(&be->comm->broken, 1);
    }
}

static void wd_thread_init(void *ctx) { cudaSetDevice(((nccl_be_t *)ctx)->device); }

/* The watchdog fired: the op fails with its detail. */
static dt_status_t watchdog_error(nccl_be_t *be, const dt_comm_req_t *req) {
    const char *d = "";
    dt_comm_watchdog_fired(&be->wd, &d);
    char what[200];
    dt_comm_describe_(req, what, sizeof what);
    return dt_error(strstr(d, "did not complete") ? DT_STATUS_TIMEOUT : DT_STATUS_NCCL,
                    "%s failed: the NCCL watchdog aborted the communicator: %s", what, d);
}

static void nccl_free(dt_comm_t *comm) {
    nccl_be_t *be = comm->be;
    if (!be) return;
    dt_comm_watchdog_stop(&be->wd);
    pthread_mutex_destroy(&be->mu);
    if (be->nc) ncclCommDestroy(be->nc);
    if (be->scratch) cudaFree(be->scratch);
    if (be->hdr) cudaFree(be->hdr);
    if (be->hdr_host) cudaFreeHost(be->hdr_host);
    if (be->ready) cudaEventDestroy(be->ready);
    if (be->stream) cudaStreamDestroy(be->stream);
    free(be);
    comm->be = NULL;
}

static dt_status_t nccl_init(dt_comm_t *comm) {
    nccl_be_t *be = dt_xcalloc(1, sizeof(*be));
    comm->be = be;
    pthread_mutexattr_t ma; /* recursive: a point-to-point header waits (and may abort) inside the enqueue */
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&be->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    be->comm = comm;
    be->device = comm->device >= 0 ? comm->device : comm->local_rank;
    CUDA_TRY(cudaSetDevice(be->device), "cudaSetDevice");
    ncclUniqueId id;
    if (comm->rank == 0) {
        NCCL_TRY(ncclGetUniqueId(&id), "ncclGetUniqueId");
        DT_CHECK(dt_comm_kv_set_(comm, &id, sizeof(id), "nccl_id"));
    } else {
        char *v = NULL;
        size_t n = 0;
        DT_CHECK(dt_comm_kv_get_(comm, &v, &n, "nccl_id"));
        if (n != sizeof(id)) {
            free(v);
            return dt_error(DT_STATUS_PROTOCOL, "nccl comm: unique id in the store has %zu bytes, expected %zu", n,
                            sizeof(id));
        }
        memcpy(&id, v, sizeof(id));
        free(v);
    }
    CUDA_TRY(cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    CUDA_TRY(cudaEventCreateWithFlags(&be->ready, cudaEventDisableTiming), "cudaEventCreate");
    CUDA_TRY(cudaMalloc((void **)&be->scratch, sizeof(float)), "cudaMalloc");
    NCCL_TRY(ncclCommInitRank(&be->nc, comm->size, id, comm->rank), "ncclCommInitRank");
    dt_comm_watchdog_hooks_t hooks = {be, wd_poll, wd_async, wd_abort, wd_thread_init};
    return dt_comm_watchdog_start(&be->wd, &hooks, comm->timeout_s, 0);
}

static ncclDataType_t nccl_type(dt_comm_dtype_t d) { return d == DT_COMM_BF16 ? ncclBfloat16 : ncclFloat32; }
static ncclRedOp_t nccl_op(dt_comm_redop_t r) {
    return r == DT_COMM_AVG ? ncclAvg : r == DT_COMM_MAX ? ncclMax : ncclSum;
}

/* Waits for the channel's stream with the hang detector running; a timeout
 * aborts the communicator (the queued NCCL work can never finish). */
static dt_status_t wait_stream(dt_comm_t *comm, nccl_be_t *be) {
    dt_comm_tick_t tick = {255};
    for (;;) {
        cudaError_t e = cudaStreamQuery(be->stream);
        if (e == cudaSuccess) return DT_STATUS_OK;
        if (e != cudaErrorNotReady)
            return dt_error(DT_STATUS_CUDA, "nccl comm: waiting for the stream: %s", cudaGetErrorString(e));
        if (dt_comm_watchdog_fired(&be->wd, NULL)) return watchdog_error(be, comm->cur);
        ncclResult_t async_err = async_error(be);
        dt_status_t st = DT_STATUS_OK;
        if (async_err != ncclSuccess) {
            char what[200];
            dt_comm_describe_(comm->cur, what, sizeof(what));
            st = nccl_error(async_err, what);
        } else {
            tick.n = 255;
            st = dt_comm_tick(comm, &tick);
        }
        if (st != DT_STATUS_OK) {
            abort_nc(be);
            return st;
        }
        dt_sleep_ms(0);
    }
}

/* Both ends of a channel announce (count, dtype, seq, op); a difference in
 * count or dtype fails before any payload moves. */
static dt_status_t p2p_header(dt_comm_t *comm, nccl_be_t *be, const dt_comm_req_t *req) {
    int peer = 1 - comm->rank;
    if (!be->hdr) CUDA_TRY(cudaMalloc((void **)&be->hdr, 8 * sizeof(uint64_t)), "cudaMalloc");
    if (!be->hdr_host) CUDA_TRY(cudaMallocHost((void **)&be->hdr_host, 8 * sizeof(uint64_t)), "cudaMallocHost");
    uint64_t *mine = be->hdr_host, *theirs = be->hdr_host + 4;
    mine[0] = req->count_;
    mine[1] = (uint64_t)req->dtype_;
    mine[2] = req->seq_;
    mine[3] = (uint64_t)req->op_;
    CUDA_TRY(cudaMemcpyAsync(be->hdr, mine, 4 * sizeof(uint64_t), cudaMemcpyHostToDevice, be->stream),
             "cudaMemcpyAsync");
    NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSend(be->hdr, 4, ncclUint64, peer, be->nc, be->stream);
    if (r == ncclSuccess) r = ncclRecv(be->hdr + 4, 4, ncclUint64, peer, be->nc, be->stream);
    ncclResult_t r2 = ncclGroupEnd();
    if (r != ncclSuccess) return nccl_error(r, "ncclSend/ncclRecv (header)");
    if (r2 != ncclSuccess) return nccl_error(r2, "ncclGroupEnd (header)");
    CUDA_TRY(cudaMemcpyAsync(theirs, be->hdr + 4, 4 * sizeof(uint64_t), cudaMemcpyDeviceToHost, be->stream),
             "cudaMemcpyAsync");
    DT_CHECK(wait_stream(comm, be));
    if (theirs[0] != mine[0] || theirs[1] != mine[1])
        return dt_comm_p2p_mismatch_(req, theirs[0], (uint32_t)theirs[1], theirs[2]);
    return DT_STATUS_OK;
}

static dt_status_t nccl_enqueue(dt_comm_t *comm, dt_comm_req_t *req) {
    nccl_be_t *be = comm->be;
    if (!be->nc) return watchdog_error(be, req);
    CUDA_TRY(cudaSetDevice(be->device), "cudaSetDevice");
    CUDA_TRY(cudaEventRecord(be->ready, cudaStreamLegacy), "cudaEventRecord");
    CUDA_TRY(cudaStreamWaitEvent(be->stream, be->ready, 0), "cudaStreamWaitEvent");
    ncclDataType_t t = nccl_type(req->dtype_);
    size_t es = dt_comm_dtype_size(req->dtype_), n = (size_t)comm->size, count = req->count_;
    switch (req->op_) {
    case DT_COMM_OP_ALL_REDUCE:
        NCCL_TRY(ncclAllReduce(req->send_, req->recv_, count, t, nccl_op(req->redop_), be->nc, be->stream),
                 "ncclAllReduce");
        break;
    case DT_COMM_OP_REDUCE_SCATTER:
        if (count % n == 0) {
            NCCL_TRY(ncclReduceScatter(req->send_, req->recv_, count / n, t, nccl_op(req->redop_), be->nc,
                                       be->stream),
                     "ncclReduceScatter");
        } else {
            NCCL_TRY(ncclGroupStart(), "ncclGroupStart");
            for (int j = 0; j < comm->size; j++) {
                const char *s = (const char *)req->send_ + dt_comm_slice_offset(count, comm->size, j) * es;
                void *dst = j == comm->rank ? req->recv_ : (void *)s;
                ncclResult_t r = ncclReduce(s, dst, dt_comm_slice_count(count, comm->size, j), t,
                                            nccl_op(req->redop_), j, be->nc, be->stream);
                if (r != ncclSuccess) {
                    dt_status_t st = nccl_error(r, "ncclReduce");
                    ncclGroupEnd();
                    return st;
                }
            }
            NCCL_TRY(ncclGroupEnd(), "ncclGroupEnd");
        }
        break;
    case DT_COMM_OP_ALL_GATHER:
        NCCL_TRY(ncclAllGather(req->send_, req->recv_, count, t, be->nc, be->stream), "ncclAllGather");
        break;
    case DT_COMM_OP_BROADCAST:
        NCCL_TRY(ncclBroadcast(req->recv_, req->recv_, count, t, req->root_, be->nc, be->stream),
                 "ncclBroadcast");
        break;
    case DT_COMM_OP_SEND:
    case DT_COMM_OP_RECV: /* on a 2-rank channel: the peer is the other rank */
        DT_CHECK(p2p_header(comm, be, req));
        if (req->op_ == DT_COMM_OP_SEND)
            NCCL_TRY(ncclSend(req->send_, count, t, 1 - comm->rank, be->nc, be->stream), "ncclSend");
        else
            NCCL_TRY(ncclRecv(req->recv_, count, t, 1 - comm->rank, be->nc, be->stream), "ncclRecv");
        break;
    case DT_COMM_OP_BARRIER:
        NCCL_TRY(ncclAllReduce(be->scratch, be->scratch, 1, ncclFloat32, ncclSum, be->nc, be->stream),
                 "ncclAllReduce (barrier)");
        break;
    }
    cudaEvent_t done;
    CUDA_TRY(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    cudaError_t e = cudaEventRecord(done, be->stream);
    if (e != cudaSuccess) {
        cudaEventDestroy(done);
        return dt_error(DT_STATUS_CUDA, "nccl comm: cudaEventRecord: %s", cudaGetErrorString(e));
    }
    req->backend_ = done;
    return DT_STATUS_OK;
}

/* Enqueues under be->mu (the watchdog cannot abort midway), then watches the op. */
static dt_status_t nccl_start(dt_comm_t *comm, dt_comm_req_t *req) {
    nccl_be_t *be = comm->be;
    pthread_mutex_lock(&be->mu);
    dt_status_t st = nccl_enqueue(comm, req);
    pthread_mutex_unlock(&be->mu);
    if (st == DT_STATUS_OK) dt_comm_watchdog_track(&be->wd, req);
    return st;
}

static dt_status_t nccl_finish(dt_comm_t *comm, dt_comm_req_t *req, int block, int *done) {
    nccl_be_t *be = comm->be;
    cudaEvent_t ev = req->backend_;
    *done = 0;
    if (!ev) {
        *done = 1;
        return DT_STATUS_OK;
    }
    if (!be->nc) { /* aborted after an earlier op failed: this one cannot complete */
        char what[200];
        dt_comm_describe_(req, what, sizeof(what));
        cudaEventDestroy(ev);
        req->backend_ = NULL;
        return dt_error(DT_STATUS_CANCELED, "%s: the NCCL communicator was aborted after an earlier failure: %s",
                        what, comm->broken_detail);
    }
    comm->cur = req;
    comm->published = 0;
    comm->op_start_ns = dt_now_ns();
    dt_status_t st = DT_STATUS_OK;
    for (;;) {
        if (dt_comm_watchdog_fired(&be->wd, NULL)) { /* its abort may have let the event complete */
            st = watchdog_error(be, req);
            break;
        }
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) {
            *done = 1;
            break;
        }
        if (e != cudaErrorNotReady) {
            st = dt_error(DT_STATUS_CUDA, "nccl comm: waiting for the op: %s", cudaGetErrorString(e));
            break;
        }
        ncclResult_t async_err = async_error(be);
        if (async_err != ncclSuccess) {
            char what[200];
            dt_comm_describe_(req, what, sizeof(what));
            st = nccl_error(async_err, what);
            abort_nc(be); /* the communicator is unusable after an asynchronous error */
            break;
        }
        if (!block) break;
        dt_comm_tick_t tick = {255};
        st = dt_comm_tick(comm, &tick);
        if (st != DT_STATUS_OK) {
            abort_nc(be);
            break;
        }
        dt_sleep_ms(0);
    }
    comm->cur = NULL;
    if (*done || st != DT_STATUS_OK) {
        dt_comm_watchdog_untrack(&be->wd, req); /* before the event goes: the watchdog polls it */
        cudaEventDestroy(ev);
        req->backend_ = NULL;
        if (st == DT_STATUS_OK) *done = 1;
    }
    return st;
}

const unsigned long dt_comm_nccl_layout = DT_COMM_LAYOUT;

const dt_comm_backend_ops_t dt_comm_nccl_ops = {
    .name = "nccl",
    .init = nccl_init,
    .free = nccl_free,
    .start = nccl_start,
    .finish = nccl_finish,
};
