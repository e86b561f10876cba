/*
 * comm_stage.c - host staging of device buffers (comm.h, stage_dev): a host
 * backend (shm, tcp, hier) runs an op on a host copy of its CUDA buffers, so
 * several ranks can share one GPU. The copies run on the thread that runs the
 * op, ordered after the work queued on the device.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/mem.h"
#include "runtime/comm/comm_impl.h"

/* ---- host staging of device buffers ------------------------------------------------ */

/* Where an op's input and output sit in the host staging buffer: the op runs
 * there in its in-place form (comm.h), so one buffer of `total` bytes holds
 * both. Input bytes come from req->send_, output bytes go to req->recv_. */
typedef struct stage_plan {
    size_t total;
    size_t in_off, in_bytes;   /* device send -> host */
    size_t out_off, out_bytes; /* host -> device recv */
} stage_plan_t;

static void plan_staging(const dt_comm_t *comm, const dt_comm_req_t *req, stage_plan_t *p) {
    size_t es = dt_comm_dtype_size(req->dtype_), count = req->count_;
    memset(p, 0, sizeof(*p));
    switch (req->op_) {
    case DT_COMM_OP_ALL_REDUCE:
        p->total = p->in_bytes = p->out_bytes = count * es;
        break;
    case DT_COMM_OP_REDUCE_SCATTER:
        p->total = p->in_bytes = count * es;
        p->out_off = dt_comm_slice_offset(count, comm->size, comm->rank) * es;
        p->out_bytes = dt_comm_slice_count(count, comm->size, comm->rank) * es;
        break;
    case DT_COMM_OP_ALL_GATHER:
        p->total = p->out_bytes = (size_t)comm->size * count * es;
        p->in_off = (size_t)comm->rank * count * es;
        p->in_bytes = count * es;
        break;
    case DT_COMM_OP_BROADCAST:
        p->total = count * es;
        if (comm->rank == req->root_)
            p->in_bytes = p->total;
        else
            p->out_bytes = p->total;
        break;
    case DT_COMM_OP_SEND:
        p->total = p->in_bytes = count * es;
        break;
    case DT_COMM_OP_RECV:
        p->total = p->out_bytes = count * es;
        break;
    case DT_COMM_OP_BARRIER:
        break;
    }
}

dt_status_t dt_comm_stage_copy_(dt_comm_t *comm, const dt_comm_req_t *req, void *dst, const void *src, size_t bytes,
                                dt_copy_kind_t kind) {
    dt_device_t *dev = comm->stage_dev;
    dt_status_t st = dev->ops->copy(dev, dst, src, bytes, kind);
    if (st == DT_STATUS_OK) return DT_STATUS_OK;
    char what[200], detail[512];
    dt_comm_describe_(req, what, sizeof(what));
    snprintf(detail, sizeof(detail), "%s", dt_error_detail());
    return dt_error(st, "%s on rank %d: staging through host memory: %s copy of %zu bytes failed: %s", what,
                    comm->rank,
                    kind == DT_COPY_DEVICE_TO_HOST   ? "device->host"
                    : kind == DT_COPY_HOST_TO_DEVICE ? "host->device"
                                                     : "device->device",
                    bytes, detail);
}

/* Runs the op on host copies of its device buffers (comm.h, stage_dev). The
 * copies happen here, on the thread running the op, so an async request is
 * complete (result on the device) when its done flag is set. */
dt_status_t dt_comm_run_staged_(dt_comm_t *comm, dt_comm_req_t *req) {
    stage_plan_t p;
    plan_staging(comm, req, &p);
    if (p.total == 0) return comm->ops->run(comm, req); /* barrier, 0-count message: no buffers */
    if (comm->stage_cap < p.total) {
        dt_mem_free(comm->stage_buf);
        comm->stage_cap = 0;
        comm->stage_buf = dt_mem_alloc(DT_MEM_COMM, p.total);
        if (!comm->stage_buf)
            return dt_error(DT_STATUS_NOMEM, "comm %s: no host memory for a %zu-byte staging buffer", comm->id,
                            p.total);
        comm->stage_cap = p.total;
    }
    uint8_t *h = comm->stage_buf;
    const void *dsend = req->send_;
    void *drecv = req->recv_;
    if (p.in_bytes) DT_CHECK(dt_comm_stage_copy_(comm, req, h + p.in_off, dsend, p.in_bytes, DT_COPY_DEVICE_TO_HOST));
    /* the in-place form of the op on the host buffer */
    req->send_ = h + (req->op_ == DT_COMM_OP_ALL_GATHER ? p.in_off : 0);
    req->recv_ = h + p.out_off;
    dt_status_t st = comm->ops->run(comm, req);
    req->send_ = dsend;
    req->recv_ = drecv;
    DT_CHECK(st);
    if (p.out_bytes) DT_CHECK(dt_comm_stage_copy_(comm, req, drecv, h + p.out_off, p.out_bytes, DT_COPY_HOST_TO_DEVICE));
    return DT_STATUS_OK;
}
