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
 * bf16: NCCL reduces bf16 in bf16 steps (each hop rounds), not the "fp32
 * accumulate, round once" of the host backends (comm.h); results can differ
 * from them in the last bit.
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

typedef struct nccl_be {
    ncclComm_t nc;
    cudaStream_t stream;
    cudaEvent_t ready;
    float *scratch; /* device float for barrier */
    int device;
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

static void nccl_free(dt_comm_t *comm) {
    nccl_be_t *be = comm->be;
    if (!be) return;
    if (be->nc) ncclCommDestroy(be->nc);
    if (be->scratch) cudaFree(be->scratch);
    if (be->ready) cudaEventDestroy(be->ready);
    if (be->stream) cudaStreamDestroy(be->stream);
    free(be);
    comm->be = NULL;
}

static dt_status_t nccl_init(dt_comm_t *comm) {
    nccl_be_t *be = dt_xcalloc(1, sizeof(*be));
    comm->be = be;
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
    return DT_STATUS_OK;
}

static ncclDataType_t nccl_type(dt_comm_dtype_t d) { return d == DT_COMM_BF16 ? ncclBfloat16 : ncclFloat32; }
static ncclRedOp_t nccl_op(dt_comm_redop_t r) {
    return r == DT_COMM_AVG ? ncclAvg : r == DT_COMM_MAX ? ncclMax : ncclSum;
}

static dt_status_t nccl_start(dt_comm_t *comm, dt_comm_req_t *req) {
    nccl_be_t *be = comm->be;
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
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) {
            *done = 1;
            break;
        }
        if (e != cudaErrorNotReady) {
            st = dt_error(DT_STATUS_CUDA, "nccl comm: waiting for the op: %s", cudaGetErrorString(e));
            break;
        }
        ncclResult_t async_err = ncclSuccess;
        ncclCommGetAsyncError(be->nc, &async_err);
        if (async_err != ncclSuccess) {
            char what[200];
            dt_comm_describe_(req, what, sizeof(what));
            st = nccl_error(async_err, what);
            ncclCommAbort(be->nc); /* the communicator is unusable after an asynchronous error */
            be->nc = NULL;
            break;
        }
        if (!block) break;
        dt_comm_tick_t tick = {255};
        st = dt_comm_tick(comm, &tick);
        if (st != DT_STATUS_OK) {
            ncclCommAbort(be->nc);
            be->nc = NULL;
            break;
        }
        dt_sleep_ms(0);
    }
    comm->cur = NULL;
    if (*done || st != DT_STATUS_OK) {
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
