/*
 * comm_bench.c - the collective benchmark's measurement (comm_bench.h): the
 * buffers on the rank's device, the timed ops per size (NCCL's asynchronous, at
 * most BENCH_INFLIGHT in flight), the slowest rank's time, the exact check after
 * the timed runs, and the copy bandwidths of the reference line: the memcpy of one
 * thread (a 64 MiB copy, best of 5) for the cpu device, the bound for shared-memory
 * busbw; for cuda the GPU's device-to-device copy (ops->copy of 64 MiB, best of 5),
 * what NCCL's busbw is judged against on one node (and the host memcpy too when
 * the ranks stage through host memory).
 */
#define _GNU_SOURCE
#include "runtime/comm/comm_bench.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/cudalib.h" /* defines: dt_cudalib_name */
#include "common/log.h"
#include "common/mem.h"
#include "kernels/kernels.h"

int dt_comm_bench_requested_backend(const dt_comm_bench_opts *o) {
    if (o->backend != DT_COMM_BACKEND_AUTO) return o->backend;
    const char *env = getenv("DTRUN_COMM");
    int b = env && *env ? dt_comm_backend_parse(env) : -1;
    return b < 0 ? DT_COMM_BACKEND_AUTO : b;
}

dt_status_t dt_comm_bench_resolve_device(dt_comm_bench_opts *o, int ngpu, int lws) {
    if (o->device == DT_COMM_BENCH_DEVICE_DEFAULT) o->device = ngpu > 0 ? DT_DEVICE_CUDA : DT_DEVICE_CPU;
    int nccl = dt_comm_bench_requested_backend(o) == DT_COMM_BACKEND_NCCL;
    if (o->device == DT_DEVICE_CUDA && ngpu == 0) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        return dt_error(DT_STATUS_USAGE, "--device cuda: no GPU is visible on this node%s%s%s",
                        vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", vis ? ")" : "");
    }
    if (o->device == DT_DEVICE_CUDA && !dt_device_built(DT_DEVICE_CUDA))
        return dt_error(DT_STATUS_USAGE, "--device cuda: no CUDA library (%s) beside this dtrun or in "
                        "LD_LIBRARY_PATH: build it with `make` where nvcc is installed", dt_cudalib_name());
    if (nccl && o->device != DT_DEVICE_CUDA)
        return dt_error(DT_STATUS_USAGE, "--backend nccl moves GPU buffers: it needs --device cuda%s",
                        ngpu == 0 ? ", and no GPU is visible on this node" : "");
    if (nccl && lws > ngpu)
        return dt_error(DT_STATUS_USAGE,
                        "--backend nccl needs one GPU per rank, but %d ranks share %d GPU(s) on this "
                        "node: use --backend auto, shm, tcp or hier (device buffers staged through host memory)",
                        lws, ngpu);
    return DT_STATUS_OK;
}

/* res->failed = why, the detail "rank R: what: <the detail so far>" (what NULL: none). */
static dt_status_t fail(dt_comm_bench_result *res, dt_comm_bench_fail_t why, int rank, const char *what) {
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", dt_error_detail()); /* dt_error overwrites it */
    res->failed = why;
    return dt_error(why == DT_COMM_BENCH_FAIL_INIT ? DT_STATUS_RENDEZVOUS : DT_STATUS_IO, "rank %d: %s%s%s", rank,
                    what ? what : "", what ? ": " : "", detail);
}

/* One rank's benchmark state. With the cuda device, in and out are device
 * memory and host is a host buffer as large, through which inputs are written
 * and results read; with cpu, in and out are host memory and host is NULL. */
typedef struct bench {
    const dt_comm_bench_opts *o;
    dt_comm_t *c;
    dt_device_t *dev; /* NULL: cpu */
    void *in, *out, *host;
    float *dval;          /* cuda: 2 floats of device memory for the per-size stats */
    dt_comm_req_t *reqs;  /* NCCL: BENCH_INFLIGHT requests in flight */
} bench_t;

enum { BENCH_INFLIGHT = 64 };

static double memcpy_gbps(void) {
    size_t bytes = 64u << 20;
    char *a = dt_mem_alloc(DT_MEM_OTHER, bytes), *b = dt_mem_alloc(DT_MEM_OTHER, bytes);
    if (!a || !b) {
        dt_mem_free(a);
        dt_mem_free(b);
        return 0;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 1e30;
    for (int k = 0; k < 5; k++) {
        double t0 = dt_now_s();
        memcpy(b, a, bytes);
        double t = dt_now_s() - t0;
        if (t < best) best = t;
        a[k] = b[bytes - 1 - k]; /* keep the copies */
    }
    dt_mem_free(a);
    dt_mem_free(b);
    return (double)bytes / best / 1e9;
}

/* Device-to-device copy bandwidth of dev (ops->copy of 64 MiB): each trial
 * times `reps` copies between synchronizations (enough copies for about 2 ms,
 * so the synchronization costs little on a fast GPU); best of 5. 0 on error. */
static double device_copy_gbps(dt_device_t *dev) {
    const dt_ops_t *ops = dev->ops;
    size_t bytes = 64u << 20;
    void *a = NULL, *b = NULL;
    double best = 0;
    if (ops->alloc(dev, DT_MEM_OTHER, bytes, &a) != DT_STATUS_OK) goto out_free;
    if (ops->alloc(dev, DT_MEM_OTHER, bytes, &b) != DT_STATUS_OK) goto out_free;
    if (ops->set(dev, a, 1, bytes) != DT_STATUS_OK || ops->synchronize(dev) != DT_STATUS_OK) goto out_free;
    double t0 = dt_now_s();
    if (ops->copy(dev, b, a, bytes, DT_COPY_DEVICE_TO_DEVICE) != DT_STATUS_OK || ops->synchronize(dev) != DT_STATUS_OK)
        goto out_free;
    double first = dt_now_s() - t0;
    int reps = first > 0 ? (int)(2e-3 / first) : 50;
    reps = reps < 1 ? 1 : reps > 50 ? 50 : reps;
    for (int k = 0; k < 5; k++) {
        t0 = dt_now_s();
        for (int r = 0; r < reps; r++)
            if (ops->copy(dev, (r & 1) ? a : b, (r & 1) ? b : a, bytes, DT_COPY_DEVICE_TO_DEVICE) != DT_STATUS_OK)
                goto out_free;
        if (ops->synchronize(dev) != DT_STATUS_OK) goto out_free;
        double gbps = (double)bytes * reps / (dt_now_s() - t0) / 1e9;
        if (gbps > best) best = gbps;
    }
out_free:
    if (best == 0) DT_LOG_WARN("device copy bandwidth: %s", dt_error_detail());
    ops->free(dev, a);
    ops->free(dev, b);
    return best;
}

static float input_value(int rank, size_t i) { return (float)((i % 13) + (size_t)rank); }

static void set_elem(void *buf, dt_comm_dtype_t dt, size_t i, float v) {
    if (dt == DT_COMM_F32)
        ((float *)buf)[i] = v;
    else
        ((uint16_t *)buf)[i] = dt_comm_f32_to_bf16(v);
}

static float get_elem(const void *buf, dt_comm_dtype_t dt, size_t i) {
    return dt == DT_COMM_F32 ? ((const float *)buf)[i] : dt_comm_bf16_to_f32(((const uint16_t *)buf)[i]);
}

/* Blocking: host backends run the op on this thread; NCCL ops complete when
 * dt_comm_wait sees their event. */
static dt_status_t run_op(bench_t *b, size_t count) {
    dt_comm_t *c = b->c;
    const dt_comm_bench_opts *o = b->o;
    switch (o->op) {
    case DT_COMM_OP_ALL_REDUCE: return dt_comm_all_reduce(c, b->in, b->out, count, o->dtype, DT_COMM_SUM);
    case DT_COMM_OP_REDUCE_SCATTER: return dt_comm_reduce_scatter(c, b->in, b->out, count, o->dtype, DT_COMM_SUM);
    case DT_COMM_OP_ALL_GATHER:
        return dt_comm_all_gather(c, b->in, b->out, count / (size_t)dt_comm_size(c), o->dtype);
    case DT_COMM_OP_BROADCAST: return dt_comm_broadcast(c, b->out, count, o->dtype, 0);
    case DT_COMM_OP_SEND: /* p2p: there and back between ranks 0 and 1 */
        if (dt_comm_rank(c) == 0) {
            DT_CHECK(dt_comm_send(c, b->in, count, o->dtype, 1));
            return dt_comm_recv(c, b->out, count, o->dtype, 1);
        }
        if (dt_comm_rank(c) == 1) {
            DT_CHECK(dt_comm_recv(c, b->out, count, o->dtype, 0));
            return dt_comm_send(c, b->out, count, o->dtype, 0);
        }
        return DT_STATUS_OK;
    default: return dt_comm_barrier(c);
    }
}

static dt_status_t start_op(bench_t *b, size_t count, dt_comm_req_t *req) {
    dt_comm_t *c = b->c;
    const dt_comm_bench_opts *o = b->o;
    switch (o->op) {
    case DT_COMM_OP_ALL_REDUCE:
        return dt_comm_all_reduce_async(c, b->in, b->out, count, o->dtype, DT_COMM_SUM, req);
    case DT_COMM_OP_REDUCE_SCATTER:
        return dt_comm_reduce_scatter_async(c, b->in, b->out, count, o->dtype, DT_COMM_SUM, req);
    case DT_COMM_OP_ALL_GATHER:
        return dt_comm_all_gather_async(c, b->in, b->out, count / (size_t)dt_comm_size(c), o->dtype, req);
    case DT_COMM_OP_BROADCAST: return dt_comm_broadcast_async(c, b->out, count, o->dtype, 0, req);
    default: return dt_comm_barrier_async(c, req);
    }
}

/* Runs iters ops. NCCL: issued asynchronously (at most BENCH_INFLIGHT
 * outstanding), all waited for at the end, as nccl-tests launches its
 * iterations and synchronizes once. Then the device is synchronized, so
 * staged results (host->device copies) have landed too. */
static dt_status_t run_iters(bench_t *b, size_t count, int iters) {
    if (dt_comm_backend(b->c) == DT_COMM_BACKEND_NCCL && b->o->op != DT_COMM_OP_SEND) {
        if (!b->reqs) b->reqs = dt_xcalloc(BENCH_INFLIGHT, sizeof *b->reqs);
        dt_comm_req_t *reqs = b->reqs;
        dt_status_t st = DT_STATUS_OK;
        int issued = 0, waited = 0;
        for (; issued < iters && st == DT_STATUS_OK; issued++) {
            if (issued - waited == BENCH_INFLIGHT) st = dt_comm_wait(&reqs[waited++ % BENCH_INFLIGHT]);
            if (st == DT_STATUS_OK) st = start_op(b, count, &reqs[issued % BENCH_INFLIGHT]);
            if (st != DT_STATUS_OK) break;
        }
        for (; waited < issued; waited++) { /* the first failure is the one reported */
            dt_status_t w = dt_comm_wait(&reqs[waited % BENCH_INFLIGHT]);
            if (st == DT_STATUS_OK) st = w;
        }
        DT_CHECK(st);
    } else {
        for (int it = 0; it < iters; it++) DT_CHECK(run_op(b, count));
    }
    return b->dev ? b->dev->ops->synchronize(b->dev) : DT_STATUS_OK;
}

/* Reduces one float across the ranks (the slowest time, the wrong count). The
 * communicator takes device memory when the buffers are on the GPU. */
static dt_status_t reduce_value(bench_t *b, float v, dt_comm_redop_t redop, float *out) {
    if (!b->dev) return dt_comm_all_reduce(b->c, &v, out, 1, DT_COMM_F32, redop);
    const dt_ops_t *ops = b->dev->ops;
    DT_CHECK(ops->copy(b->dev, b->dval, &v, sizeof v, DT_COPY_HOST_TO_DEVICE));
    DT_CHECK(dt_comm_all_reduce(b->c, b->dval, b->dval + 1, 1, DT_COMM_F32, redop));
    DT_CHECK(ops->copy(b->dev, out, b->dval + 1, sizeof *out, DT_COPY_DEVICE_TO_HOST));
    return DT_STATUS_OK;
}

/* host -> the bench's buffer (device memory with cuda). */
static dt_status_t upload(bench_t *b, void *dst, const void *src, size_t bytes) {
    if (!b->dev) return DT_STATUS_OK; /* src is dst on the cpu */
    return b->dev->ops->copy(b->dev, dst, src, bytes, DT_COPY_HOST_TO_DEVICE);
}

/* Elements of the checked run that differ from the exact expected values.
 * Inputs are written and the result read outside any timed region. */
static size_t count_wrong(bench_t *b, size_t count, dt_status_t *st) {
    const dt_comm_bench_opts *o = b->o;
    int n = dt_comm_size(b->c), r = dt_comm_rank(b->c);
    size_t es = dt_comm_dtype_size(o->dtype);
    size_t wrong = 0, per = count / (size_t)n;
    size_t nin = o->op == DT_COMM_OP_ALL_GATHER ? per : count;
    void *hin = b->dev ? b->host : b->in, *hout = b->dev ? b->host : b->out;
    for (size_t i = 0; i < nin; i++) set_elem(hin, o->dtype, i, input_value(r, i));
    *st = upload(b, b->in, hin, nin * es);
    if (*st != DT_STATUS_OK) return count;
    if (o->op == DT_COMM_OP_BROADCAST || o->op == DT_COMM_OP_SEND) {
        for (size_t i = 0; i < count; i++)
            set_elem(hout, o->dtype, i, r == 0 && o->op == DT_COMM_OP_BROADCAST ? input_value(0, i) : -1.0f);
        *st = upload(b, b->out, hout, count * es);
        if (*st != DT_STATUS_OK) return count;
    }
    *st = run_op(b, count);
    if (*st != DT_STATUS_OK) return count;
    size_t nout = o->op == DT_COMM_OP_REDUCE_SCATTER ? dt_comm_slice_count(count, n, r)
                  : o->op == DT_COMM_OP_ALL_GATHER   ? per * (size_t)n
                  : o->op == DT_COMM_OP_SEND && r > 1 ? 0 /* p2p: ranks 0 and 1 only */
                                                     : count;
    size_t off = o->op == DT_COMM_OP_REDUCE_SCATTER ? dt_comm_slice_offset(count, n, r) : 0;
    if (b->dev) {
        /* poison first, so a result that never arrived cannot pass as the input */
        memset(hout, 0xFF, nout * es);
        *st = b->dev->ops->copy(b->dev, hout, b->out, nout * es, DT_COPY_DEVICE_TO_HOST);
        if (*st != DT_STATUS_OK) return count;
    }
    for (size_t i = 0; i < nout; i++) {
        float want;
        size_t g = off + i;
        if (o->op == DT_COMM_OP_ALL_GATHER)
            want = input_value((int)(i / per), i % per);
        else if (o->op == DT_COMM_OP_BROADCAST || o->op == DT_COMM_OP_SEND) /* p2p: rank 0's, there and back */
            want = input_value(0, g);
        else
            want = (float)((g % 13) * (size_t)n + (size_t)n * (size_t)(n - 1) / 2);
        if (get_elem(hout, o->dtype, i) != want) wrong++;
    }
    return wrong;
}

/* The buffers (cap bytes each) on b->dev, or in host memory when it is NULL. */
static dt_status_t buffers_alloc(bench_t *b, size_t cap) {
    if (!b->dev) {
        b->in = dt_mem_alloc(DT_MEM_COMM, cap);
        b->out = dt_mem_alloc(DT_MEM_COMM, cap);
        if (!b->in || !b->out) return dt_error(DT_STATUS_NOMEM, "out of host memory for two %zu-byte buffers", cap);
        memset(b->in, 0, cap);
        memset(b->out, 0, cap);
        return DT_STATUS_OK;
    }
    const dt_ops_t *ops = b->dev->ops;
    DT_CHECK(ops->alloc(b->dev, DT_MEM_COMM, cap, &b->in));
    DT_CHECK(ops->alloc(b->dev, DT_MEM_COMM, cap, &b->out));
    DT_CHECK(ops->alloc(b->dev, DT_MEM_COMM, 2 * sizeof(float), (void **)&b->dval));
    b->host = dt_mem_alloc(DT_MEM_COMM, cap);
    if (!b->host) return dt_error(DT_STATUS_NOMEM, "out of host memory for a %zu-byte buffer", cap);
    return ops->synchronize(b->dev);
}

static void buffers_free(bench_t *b) {
    free(b->reqs);
    if (b->dev) {
        b->dev->ops->free(b->dev, b->in);
        b->dev->ops->free(b->dev, b->out);
        b->dev->ops->free(b->dev, b->dval);
        dt_mem_free(b->host);
    } else {
        dt_mem_free(b->in);
        dt_mem_free(b->out);
    }
}

/* Opens the rank's device and allocates the buffers (cap bytes each). */
static dt_status_t bench_alloc(bench_t *b, int local_rank, size_t cap) {
    if (b->o->device != DT_DEVICE_CPU) {
        int ngpu = dt_device_count(DT_DEVICE_CUDA);
        dt_device_opts_t opts = {.kind = DT_DEVICE_CUDA, .nthreads = 1,
                                 .ordinal = ngpu > 0 ? local_rank % ngpu : 0, .dtype = DT_DTYPE_F32};
        DT_CHECK(dt_device_open(&b->dev, &opts));
    }
    return buffers_alloc(b, cap);
}

static void bench_free(bench_t *b) {
    buffers_free(b);
    if (b->dev) dt_device_free(b->dev);
}

dt_status_t dt_comm_bench_run(const dt_comm_bench_opts *o, dt_comm_config_t *cfg, int lws,
                              const dt_comm_bench_report *rep, dt_comm_bench_result *res) {
    memset(res, 0, sizeof *res);
    res->rank = -1;
    int ngpu = o->device == DT_DEVICE_CPU ? 0 : dt_device_count(DT_DEVICE_CUDA);
    cfg->backend = (dt_comm_backend_t)o->backend;
    cfg->chunk_bytes = o->chunk;
    cfg->tcp_conns = o->conns;

    bench_t b = {.o = o};
    dt_status_t st = DT_STATUS_OK;
    size_t es = dt_comm_dtype_size(o->dtype);
    size_t cap = (o->max / es + (size_t)cfg->world_size + 16) * es;
    if (bench_alloc(&b, cfg->local_rank, cap) != DT_STATUS_OK) {
        st = fail(res, DT_COMM_BENCH_FAIL_ALLOC, cfg->rank,
                  o->device == DT_DEVICE_CUDA ? "opening the GPU and its buffers" : "buffers");
        goto out_free;
    }
    int staged = 0;
    if (b.dev) {
        cfg->stage_dev = b.dev; /* shm/tcp/hier stage through host memory; NCCL ignores it */
        if (lws <= ngpu) cfg->device = b.dev->ordinal; /* a GPU per rank: backend auto picks NCCL */
    }
    if (dt_comm_init(cfg, &b.c) != DT_STATUS_OK) {
        st = fail(res, DT_COMM_BENCH_FAIL_INIT, cfg->rank, "creating the communicator");
        goto out_free;
    }
    staged = b.dev && dt_comm_backend(b.c) != DT_COMM_BACKEND_NCCL;
    int n = dt_comm_size(b.c), r = dt_comm_rank(b.c);
    res->rank = r;
    if (o->op == DT_COMM_OP_SEND && n < 2) {
        res->failed = DT_COMM_BENCH_FAIL_USAGE;
        st = dt_error(DT_STATUS_USAGE, "--op p2p needs at least 2 ranks (it has %d)", n);
        goto out_free_comm;
    }
    double busf = o->op == DT_COMM_OP_ALL_REDUCE   ? 2.0 * (n - 1) / n
                  : o->op == DT_COMM_OP_BROADCAST || o->op == DT_COMM_OP_SEND ? 1.0
                                                  : (double)(n - 1) / n;
    dt_comm_bench_info info = {.n_ranks = n, .backend = dt_comm_backend(b.c), .gpu = b.dev != NULL,
                               .ordinal = b.dev ? b.dev->ordinal : 0, .gpu_name = b.dev ? b.dev->name : NULL,
                               .staged = staged};
    if (dt_comm_barrier(b.c) != DT_STATUS_OK) goto out_comm_failed;
    if (r == 0 && b.dev) info.copy_gbps = device_copy_gbps(b.dev);
    if (r == 0 && (!b.dev || staged)) info.host_copy_gbps = memcpy_gbps();
    if (dt_comm_barrier(b.c) != DT_STATUS_OK) goto out_comm_failed;
    if (r == 0 && rep->header) rep->header(rep->ctx, o, &info);
    for (size_t size = o->min; size <= o->max;) {
        size_t count = size / es;
        if (o->op == DT_COMM_OP_ALL_GATHER) count = count / (size_t)n * (size_t)n;
        if (count == 0) count = o->op == DT_COMM_OP_ALL_GATHER ? (size_t)n : 1;
        if (run_iters(&b, count, o->warmup) != DT_STATUS_OK) goto out_comm_failed;
        if (dt_comm_barrier(b.c) != DT_STATUS_OK) goto out_comm_failed;
        double t0 = dt_now_s();
        if (run_iters(&b, count, o->iters) != DT_STATUS_OK) goto out_comm_failed;
        float us = (float)((dt_now_s() - t0) / o->iters * 1e6), slowest = 0;
        if (o->op == DT_COMM_OP_SEND) us /= 2; /* p2p: one message of the round trip */
        if (reduce_value(&b, us, DT_COMM_MAX, &slowest) != DT_STATUS_OK) goto out_comm_failed;
        dt_status_t cst;
        float wrong = (float)count_wrong(&b, count, &cst), all_wrong = 0;
        if (cst != DT_STATUS_OK) goto out_comm_failed;
        if (reduce_value(&b, wrong, DT_COMM_SUM, &all_wrong) != DT_STATUS_OK) goto out_comm_failed;
        res->total_wrong += (size_t)all_wrong;
        size_t bytes = count * es;
        double algbw = (double)bytes / (slowest * 1e-6) / 1e9;
        if (r == 0 && rep->line) {
            dt_comm_bench_line l = {.bytes = bytes, .count = count, .time_us = slowest, .algbw = algbw,
                                    .busbw = algbw * busf, .wrong = (size_t)all_wrong};
            rep->line(rep->ctx, o, &l);
        }
        double next = (double)size * o->factor; /* no cast past max: it ends the loop */
        if (next > (double)o->max) break;
        size = (size_t)next > size ? (size_t)next : size + 1;
    }
    goto out_free_comm;

out_comm_failed:
    st = fail(res, DT_COMM_BENCH_FAIL_RUN, r, NULL);
out_free_comm:
    dt_comm_free(b.c);
out_free:
    bench_free(&b);
    return st;
}

/* ---- the preflight's health check (dt_comm_health_run) ---------------------- */

/* iters timed ops on b->c after one untimed, the slowest rank's seconds per op. */
static dt_status_t timed(bench_t *b, size_t count, int iters, double *secs) {
    DT_CHECK(run_iters(b, count, 1));
    DT_CHECK(dt_comm_barrier(b->c));
    double t0 = dt_now_s();
    DT_CHECK(run_iters(b, count, iters));
    float s = (float)((dt_now_s() - t0) / iters), slowest = 0;
    DT_CHECK(reduce_value(b, s, DT_COMM_MAX, &slowest));
    *secs = slowest;
    return DT_STATUS_OK;
}

/* count floats from rank `from` to rank `to` of b->c, answered by one float, iters
 * times after one untimed: the bandwidth of that direction (GB/s) on `from`, whose
 * clock times it (the answer's latency is the error). Other ranks idle. */
static dt_status_t one_way(bench_t *b, size_t count, int iters, int from, int to, double *gbps) {
    int r = dt_comm_rank(b->c);
    if (r != from && r != to) return DT_STATUS_OK;
    double t0 = 0;
    for (int it = 0; it <= iters; it++) {
        if (it == 1) t0 = dt_now_s();
        if (r == from) {
            DT_CHECK(dt_comm_send(b->c, b->in, count, DT_COMM_F32, to));
            DT_CHECK(dt_comm_recv(b->c, b->out, 1, DT_COMM_F32, to));
        } else {
            DT_CHECK(dt_comm_recv(b->c, b->out, count, DT_COMM_F32, from));
            DT_CHECK(dt_comm_send(b->c, b->out, 1, DT_COMM_F32, from));
        }
    }
    if (b->dev) DT_CHECK(b->dev->ops->synchronize(b->dev));
    if (r == from) *gbps = (double)count * sizeof(float) / ((dt_now_s() - t0) / iters) / 1e9;
    return DT_STATUS_OK;
}

static double median(const double *v, int n) {
    double *s = dt_xmalloc((size_t)n * sizeof *s), m;
    memcpy(s, v, (size_t)n * sizeof *s);
    for (int i = 1; i < n; i++) /* insertion sort: a node count */
        for (int j = i; j > 0 && s[j - 1] > s[j]; j--) m = s[j], s[j] = s[j - 1], s[j - 1] = m;
    m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    free(s);
    return m;
}

#define HEALTH_OUT(...) (o += (size_t)snprintf(out + o, o < cap ? cap - o : 0, __VA_ARGS__), o = o < cap ? o : cap)

/* Rank 0's verdict on the gathered figures: lines into res->report, res->bad. */
static void health_verdict(const dt_comm_health_opts *ho, int n, int lws, int nn, const char *backend, double world,
                           const double *intra, const double *to0, const double *from0, const double *wrong,
                           dt_comm_health_result *res) {
    size_t cap = 4096 + (size_t)nn * 400, o = 0;
    char *out = dt_xmalloc(cap);
    out[0] = '\0';
    double floor = ho->min_busbw_gbps;
    HEALTH_OUT("preflight: all-reduce of %.0f MiB over %d rank(s) (%s): busbw %.2f GB/s", ho->bytes / 1048576.0, n,
               backend, world);
    double total_wrong = 0;
    for (int k = 0; k < nn; k++) total_wrong += wrong[k];
    HEALTH_OUT("%s\n", total_wrong ? "" : ", results exact");
    if (nn == 1 && wrong[0]) {
        HEALTH_OUT("preflight: error: %.0f element(s) of the all-reduce's result are wrong (a failing GPU, memory "
                   "or link)\n", wrong[0]);
        res->bad++;
    }
    if (floor > 0 && world < floor) {
        HEALTH_OUT("preflight: error: the job's all-reduce busbw %.2f GB/s is under the floor of %.2f GB/s "
                   "(--preflight_min_busbw)\n", world, floor);
        res->bad++;
    }
    double *link = dt_xcalloc((size_t)nn, sizeof *link); /* each node's slower direction to node 0 */
    for (int k = 1; k < nn; k++) link[k] = to0[k] < from0[k] ? to0[k] : from0[k];
    double mi = lws > 1 ? median(intra, nn) : 0, mp = nn > 1 ? median(link + 1, nn - 1) : 0;
    for (int k = 0; k < nn && nn > 1; k++) { /* one node: its figure is the world's */
        char node[64];
        snprintf(node, sizeof node, "node %d (ranks %d-%d)", k, k * lws, k * lws + lws - 1);
        if (k == 0 && lws == 1 && !wrong[0]) continue; /* nothing of its own to show */
        HEALTH_OUT("preflight: %s:", node);
        if (lws > 1) HEALTH_OUT(" within the node %.2f GB/s busbw", intra[k]);
        if (k > 0) HEALTH_OUT("%s to node 0 %.2f GB/s, from node 0 %.2f GB/s", lws > 1 ? "," : "", to0[k], from0[k]);
        HEALTH_OUT("\n");
        if (wrong[k]) {
            HEALTH_OUT("preflight: error: %s: %.0f element(s) of the all-reduce's result are wrong (a failing GPU, "
                       "memory or link)\n", node, wrong[k]);
            res->bad++;
        }
        if (lws > 1 && floor > 0 && intra[k] < floor) {
            HEALTH_OUT("preflight: error: %s: the all-reduce within the node, %.2f GB/s, is under the floor of "
                       "%.2f GB/s (--preflight_min_busbw)\n", node, intra[k], floor);
            res->bad++;
        } else if (lws > 1 && nn > 2 && intra[k] < mi / 2) {
            HEALTH_OUT("preflight: warning: %s is slow within the node: %.2f GB/s, the nodes' median is %.2f GB/s\n",
                       node, intra[k], mi);
        }
        if (k > 0 && floor > 0 && link[k] < floor) {
            HEALTH_OUT("preflight: error: %s: %.2f GB/s %s node 0 is under the floor of %.2f GB/s "
                       "(--preflight_min_busbw)%s\n", node, link[k], to0[k] < from0[k] ? "to" : "from", floor,
                       nn == 2 ? " (node 0's link or node 1's: a pair cannot tell which)" : "");
            res->bad++;
        } else if (k > 0 && nn > 2 && link[k] < mp / 2) {
            HEALTH_OUT("preflight: warning: %s has a slow link: %.2f GB/s %s node 0, the nodes' median is %.2f GB/s\n",
                       node, link[k], to0[k] < from0[k] ? "to" : "from", mp);
        }
    }
    free(link);
    res->report = out;
}

dt_status_t dt_comm_health_run(dt_comm_t *world, dt_device_t *dev, int lws, const dt_comm_health_opts *ho,
                               dt_comm_health_result *res) {
    memset(res, 0, sizeof *res);
    dt_comm_bench_opts bo = {.op = DT_COMM_OP_ALL_REDUCE, .dtype = DT_COMM_F32, .iters = ho->iters, .warmup = 1,
                             .device = dev ? DT_DEVICE_CUDA : DT_DEVICE_CPU};
    bench_t b = {.o = &bo, .c = world, .dev = dev};
    int n = dt_comm_size(world), r = dt_comm_rank(world);
    if (lws <= 0 || n % lws) lws = n; /* nodes of unequal sizes: the world is one "node" */
    int nn = n / lws, node = r / lws, lr = r % lws;
    size_t count = ho->bytes / sizeof(float);
    if (count < (size_t)n) count = (size_t)n;
    dt_comm_t *local = NULL, *lead = NULL;
    enum { F = 4 }; /* per node: intra busbw, to node 0, from node 0, wrong elements */
    double *fig = dt_xcalloc((size_t)nn * F, sizeof *fig);
    float *vec = dt_xcalloc((size_t)nn * F, sizeof *vec), *sum = dt_xcalloc((size_t)nn * F, sizeof *sum);
    size_t cap = count > (size_t)nn * F ? count : (size_t)nn * F; /* the figures travel through it too */
    dt_status_t st = buffers_alloc(&b, (cap + 16) * sizeof(float));
    double world_s = 0, intra_s = 0;
    if (st == DT_STATUS_OK) st = timed(&b, count, ho->iters, &world_s);
    dt_status_t cst = DT_STATUS_OK;
    float wrong = st == DT_STATUS_OK ? (float)count_wrong(&b, count, &cst) : 0;
    if (st == DT_STATUS_OK) st = cst;
    /* within each node (every node at once), and each node's first rank to node 0's */
    if (st == DT_STATUS_OK && nn > 1 && lws > 1) st = dt_comm_split(world, node, lr, &local);
    if (st == DT_STATUS_OK && local) {
        b.c = local;
        st = timed(&b, count, ho->iters, &intra_s);
        b.c = world;
    }
    if (st == DT_STATUS_OK && nn > 1) st = dt_comm_split(world, lr == 0 ? 0 : 1, node, &lead);
    if (st == DT_STATUS_OK && lead && lr == 0) /* node 0's first rank writes "from", node k's "to" */
        for (int k = 1; k < nn && st == DT_STATUS_OK; k++) {
            b.c = lead;
            double g = 0;
            st = one_way(&b, count, ho->iters, k, 0, &g);
            if (node == k) vec[k * F + 1] = (float)g;
            if (st == DT_STATUS_OK) st = one_way(&b, count, ho->iters, 0, k, &g);
            if (node == 0) vec[k * F + 2] = (float)g;
        }
    b.c = world;
    /* every rank's figures into its node's slots, summed over the world (the ranks of a
     * node agree on intra, only the first has the pair) */
    if (st == DT_STATUS_OK) {
        double bytes = (double)count * sizeof(float);
        if (lws > 1) {
            double t = nn > 1 ? intra_s : world_s;
            vec[node * F + 0] = lr == 0 ? (float)(bytes / t * 2.0 * (lws - 1) / lws / 1e9) : 0;
        }
        vec[node * F + 3] = wrong;
        size_t nv = (size_t)nn * F;
        if (!dev) {
            st = dt_comm_all_reduce(world, vec, sum, nv, DT_COMM_F32, DT_COMM_SUM);
        } else { /* the communicator may take device memory only: through b.out */
            const dt_ops_t *ops = dev->ops;
            st = ops->copy(dev, b.in, vec, nv * sizeof(float), DT_COPY_HOST_TO_DEVICE);
            if (st == DT_STATUS_OK) st = dt_comm_all_reduce(world, b.in, b.out, nv, DT_COMM_F32, DT_COMM_SUM);
            if (st == DT_STATUS_OK) st = ops->copy(dev, sum, b.out, nv * sizeof(float), DT_COPY_DEVICE_TO_HOST);
            if (st == DT_STATUS_OK) st = ops->synchronize(dev);
        }
    }
    if (st == DT_STATUS_OK && r == 0) {
        double *intra = fig, *to0 = fig + nn, *from0 = fig + 2 * nn, *wr = fig + 3 * nn;
        for (int k = 0; k < nn; k++)
            intra[k] = sum[k * F], to0[k] = sum[k * F + 1], from0[k] = sum[k * F + 2], wr[k] = sum[k * F + 3];
        double busbw = (double)count * sizeof(float) / world_s * 2.0 * (n - 1) / n / 1e9;
        res->busbw_gbps = busbw;
        dt_comm_health_opts shown = *ho;
        shown.bytes = count * sizeof(float);
        health_verdict(&shown, n, lws, nn, dt_comm_backend_name(dt_comm_backend(world)), busbw, intra, to0, from0, wr,
                       res);
    }
    if (st == DT_STATUS_OK) { /* every rank learns the verdict: all stop, or none */
        float bad = (float)res->bad, any = 0;
        st = reduce_value(&b, bad, DT_COMM_MAX, &any);
        res->bad = (int)any;
    }
    if (lead) dt_comm_free(lead);
    if (local) dt_comm_free(local);
    buffers_free(&b);
    free(fig);
    free(vec);
    free(sum);
    return st;
}
