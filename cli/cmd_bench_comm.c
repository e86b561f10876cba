/*
 * cmd_bench_comm.c - `dtrun [launch flags] bench comm [flags]`: the collective
 * bandwidth table in the style of nccl-tests, printed by rank 0.
 *
 * Each rank runs dt_bench_comm_main (the hidden subcommand `dtrun
 * __bench_comm_rank`, which the agent runs once per rank). With --nproc N and no
 * RANK in the environment it is a standalone launch of N local ranks through the
 * agent (runtime/launch/agent.h), as `dtrun --standalone --nproc_per_node N
 * bench comm` is; --local-world-size L makes the ranks group into nodes of L
 * (the hierarchical backend on one machine).
 *
 * Columns: size (bytes of the full buffer: the input of all_reduce, broadcast
 * and reduce_scatter, the output of all_gather), count (elements of it), type,
 * redop, time (us per op, the slowest rank's mean), algbw = size / time, busbw =
 * algbw * factor (nccl-tests: 2(n-1)/n all_reduce, (n-1)/n reduce_scatter and
 * all_gather, 1 broadcast and p2p), #wrong (elements that differ from the expected
 * result in a checked run after the timed ones; exact integer-valued inputs).
 *
 * --device cpu|cuda (default cuda when a GPU is visible: dt_gpuinfo_count
 * in the agent, which must not touch CUDA before it forks, dt_device_count in
 * the rank, which loads the CUDA library). With cuda each rank opens GPU
 * LOCAL_RANK % visible GPUs and the buffers are device memory. When every rank
 * of the node has its own GPU the communicator gets the device (backend auto
 * is NCCL); when ranks share a GPU only the host backends can run (staging
 * through host memory, comm.h stage_dev) and --backend nccl is refused. Inputs
 * are uploaded and results downloaded outside the timed region. The timed
 * region ends with the device synchronized; NCCL ops are issued
 * asynchronously and waited for at the end, as nccl-tests does, so time is
 * the total over --iters divided by --iters.
 *
 * --op p2p: a ping-pong between ranks 0 and 1 (point to point, comm.h): rank 0
 * sends the buffer to rank 1, which sends it back; time is half the round trip
 * (one message), algbw = busbw = size / time, as nccl-tests' sendrecv reports.
 * Other ranks idle. It runs blocking on every backend, NCCL too.
 *
 * Reference line: the memcpy bandwidth of one thread (a 64 MiB copy, best of
 * 5) for the cpu device, the bound for shared-memory busbw; for cuda the
 * device-to-device copy bandwidth of the GPU (ops->copy of 64 MiB, best of 5),
 * what NCCL's busbw is judged against on one node (and the host memcpy too
 * when the ranks stage through host memory).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/clock.h"
#include "common/cudalib.h" /* defines: dt_cudalib_name */
#include "common/gpuinfo.h" /* defines: dt_gpuinfo_count */
#include "common/log.h"
#include "common/mem.h"
#include "common/torchenv.h"
#include "kernels/kernels.h"
#include "runtime/comm/comm.h"
#include "runtime/launch/launch_args.h"

extern char **environ;

/* --device: unset (the default: cuda when a GPU is visible), cpu or cuda. */
enum { BENCH_DEVICE_DEFAULT = -1 };

typedef struct bench_opts {
    dt_comm_op_t op;
    size_t min, max;
    double factor;
    int iters, warmup;
    dt_comm_dtype_t dtype;
    int backend;
    int nproc, lws;
    size_t chunk;
    int conns;
    int device; /* BENCH_DEVICE_DEFAULT or a dt_device_kind_t */
} bench_opts_t;

static const char bench_usage[] =
    "usage: dtrun [LAUNCH FLAGS] bench comm [--op all_reduce|reduce_scatter|all_gather|broadcast|p2p]\n"
    "         [--min 8] [--max 256M] [--factor 2] [--iters 20] [--warmup 5] [--dtype f32|bf16]\n"
    "         [--device cpu|cuda] [--backend auto|shm|tcp|hier|nccl] [--chunk BYTES] [--conns K]\n"
    "       dtrun __bench_comm_rank --nproc N [--local-world-size L] [same flags]   (one node, no launch flags)\n"
    "  --device: default cuda when a GPU is visible, else cpu; with cuda each rank uses GPU\n"
    "  LOCAL_RANK % GPUs; --backend nccl needs a GPU per rank (ranks sharing a GPU stage\n"
    "  device buffers through host memory over shm/tcp/hier)\n";

static int parse_size(const char *s, size_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return -1;
    double m = 1;
    if (*end == 'K' || *end == 'k') m = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') m = 1024.0 * 1024.0, end++;
    else if (*end == 'G' || *end == 'g') m = 1024.0 * 1024.0 * 1024.0, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    *out = (size_t)(v * m);
    return 0;
}

static int parse_args(int argc, char **argv, bench_opts_t *o) {
    *o = (bench_opts_t){DT_COMM_OP_ALL_REDUCE, 8, 256u << 20, 2, 20, 5, DT_COMM_F32, DT_COMM_BACKEND_AUTO, 0, 0, 0,
                        0, BENCH_DEVICE_DEFAULT};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(bench_usage, stdout);
            return 1;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "dtrun bench comm: %s needs a value\n%s", a, bench_usage);
            return -1;
        }
        i++;
        int bad = 0;
        if (!strcmp(a, "--op")) {
            if (!strcmp(v, "all_reduce")) o->op = DT_COMM_OP_ALL_REDUCE;
            else if (!strcmp(v, "reduce_scatter")) o->op = DT_COMM_OP_REDUCE_SCATTER;
            else if (!strcmp(v, "all_gather")) o->op = DT_COMM_OP_ALL_GATHER;
            else if (!strcmp(v, "broadcast")) o->op = DT_COMM_OP_BROADCAST;
            else if (!strcmp(v, "p2p")) o->op = DT_COMM_OP_SEND; /* ping-pong between ranks 0 and 1 */
            else bad = 1;
        } else if (!strcmp(a, "--min")) {
            bad = parse_size(v, &o->min);
        } else if (!strcmp(a, "--max")) {
            bad = parse_size(v, &o->max);
        } else if (!strcmp(a, "--factor")) {
            o->factor = atof(v);
            bad = !(o->factor > 1.0);
        } else if (!strcmp(a, "--iters")) {
            o->iters = atoi(v);
            bad = o->iters < 1;
        } else if (!strcmp(a, "--warmup")) {
            o->warmup = atoi(v);
            bad = o->warmup < 0 || (o->warmup == 0 && strcmp(v, "0"));
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "f32") || !strcmp(v, "float")) o->dtype = DT_COMM_F32;
            else if (!strcmp(v, "bf16")) o->dtype = DT_COMM_BF16;
            else bad = 1;
        } else if (!strcmp(a, "--device")) {
            dt_device_kind_t k;
            bad = dt_device_kind_parse(v, &k) != DT_STATUS_OK;
            o->device = (int)k;
        } else if (!strcmp(a, "--backend")) {
            o->backend = dt_comm_backend_parse(v);
            bad = o->backend < 0;
        } else if (!strcmp(a, "--nproc")) {
            o->nproc = atoi(v);
            bad = o->nproc < 1 || o->nproc > 64;
        } else if (!strcmp(a, "--local-world-size")) {
            o->lws = atoi(v);
            bad = o->lws < 1;
        } else if (!strcmp(a, "--chunk")) {
            bad = parse_size(v, &o->chunk);
        } else if (!strcmp(a, "--conns")) {
            o->conns = atoi(v);
            bad = o->conns < 1 || o->conns > 8;
        } else {
            fprintf(stderr, "dtrun bench comm: unknown flag %s\n%s", a, bench_usage);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "dtrun bench comm: bad value for %s: \"%s\"\n", a, v);
            return -1;
        }
    }
    if (o->min < 1 || o->max < o->min) {
        fprintf(stderr, "dtrun bench comm: need 1 <= --min <= --max\n");
        return -1;
    }
    return 0;
}

/* The backend the communicator will be asked for: --backend, else DTRUN_COMM
 * (as dt_comm_init reads it), else auto. */
static int requested_backend(const bench_opts_t *o) {
    if (o->backend != DT_COMM_BACKEND_AUTO) return o->backend;
    const char *env = getenv("DTRUN_COMM");
    int b = env && *env ? dt_comm_backend_parse(env) : -1;
    return b < 0 ? DT_COMM_BACKEND_AUTO : b;
}

/* Resolves --device from ngpu visible GPUs and checks it against the backend
 * and lws ranks per node. Returns 0, or prints why not and returns -1. */
static int resolve_device(bench_opts_t *o, int ngpu, int lws) {
    if (o->device == BENCH_DEVICE_DEFAULT) o->device = ngpu > 0 ? DT_DEVICE_CUDA : DT_DEVICE_CPU;
    int nccl = requested_backend(o) == DT_COMM_BACKEND_NCCL;
    if (o->device == DT_DEVICE_CUDA && ngpu == 0) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        fprintf(stderr, "dtrun bench comm: --device cuda: no GPU is visible on this node%s%s%s\n",
                vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", vis ? ")" : "");
        return -1;
    }
    if (o->device == DT_DEVICE_CUDA && !dt_device_built(DT_DEVICE_CUDA)) {
        fprintf(stderr, "dtrun bench comm: --device cuda: no CUDA library (%s) beside this dtrun or in "
                "LD_LIBRARY_PATH: build it with `make` where nvcc is installed\n", dt_cudalib_name());
        return -1;
    }
    if (nccl && o->device != DT_DEVICE_CUDA) {
        fprintf(stderr, "dtrun bench comm: --backend nccl moves GPU buffers: it needs --device cuda%s\n",
                ngpu == 0 ? ", and no GPU is visible on this node" : "");
        return -1;
    }
    if (nccl && lws > ngpu) {
        fprintf(stderr,
                "dtrun bench comm: --backend nccl needs one GPU per rank, but %d ranks share %d GPU(s) on this "
                "node: use --backend auto, shm, tcp or hier (device buffers staged through host memory)\n",
                lws, ngpu);
        return -1;
    }
    return 0;
}

int dt_bench_comm_check(int argc, char **argv, int local_world_size) {
    char **args = dt_xcalloc((size_t)argc + 2, sizeof *args);
    args[0] = "bench comm";
    for (int i = 0; i < argc; i++) args[i + 1] = argv[i];
    bench_opts_t o;
    int p = parse_args(argc + 1, args, &o);
    free(args);
    if (p) return p > 0 ? DT_EXIT_OK : DT_EXIT_USAGE;
    /* Under launch flags the ranks are the launch's: a --nproc that disagrees would
     * be ignored by every rank, so say which flag starts them. */
    if (o.nproc > 0 && o.nproc != local_world_size) {
        fprintf(stderr,
                "dtrun bench comm: --nproc %d, but the launch starts %d rank(s) per node: give --nproc_per_node %d "
                "before `bench comm` (or run `dtrun __bench_comm_rank --nproc %d`)\n",
                o.nproc, local_world_size, o.nproc, o.nproc);
        return DT_EXIT_USAGE;
    }
    /* The agent forks the ranks: count GPUs without initialising CUDA. */
    if (resolve_device(&o, dt_gpuinfo_count(), local_world_size) != 0) return DT_EXIT_USAGE;
    return -1;
}

/* ---- a local launch (--nproc) ----------------------------------------------------- */

/* `dtrun __bench_comm_rank --nproc N [flags]` with no launcher around it: the
 * agent runs N ranks of `dtrun __bench_comm_rank [flags]` on this node, as
 * `dtrun --standalone --nproc_per_node N bench comm [flags]` would (the same
 * environment, output, signal and failure handling as training). A
 * --local-world-size L goes on to the ranks, which regroup into nodes of L. */
static int launch_local(int argc, char **argv, const bench_opts_t *o) {
    int n = o->nproc, lws = o->lws ? o->lws : n;
    if (n % lws) {
        fprintf(stderr, "dtrun bench comm: --local-world-size %d does not divide --nproc %d\n", lws, n);
        return DT_EXIT_USAGE;
    }
    bench_opts_t checked = *o; /* the agent forks: count GPUs without initialising CUDA */
    if (resolve_device(&checked, dt_gpuinfo_count(), lws) != 0) return DT_EXIT_USAGE;
    dt_launch_spec_t spec;
    if (dt_launch_spec_standalone(n, DT_LAUNCH_MODE_BENCH_COMM, environ, &spec) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun bench comm: %s\n", dt_error_detail());
        return DT_EXIT_USAGE;
    }
    char **args = dt_xcalloc((size_t)argc, sizeof *args); /* the flags less --nproc N */
    int na = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc")) {
            i++;
            continue;
        }
        args[na++] = argv[i];
    }
    dt_log_set_prefix("dtrun agent");
    int code = dt_cli_run_self(&spec, "__bench_comm_rank", NULL, args, na);
    free(args);
    dt_launch_spec_free(&spec);
    return code;
}

/* ---- the measurement ----------------------------------------------------------------- */

/* One rank's benchmark state. With the cuda device, in and out are device
 * memory and host is a host buffer as large, through which inputs are written
 * and results read; with cpu, in and out are host memory and host is NULL. */
typedef struct bench {
    const bench_opts_t *o;
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
    const bench_opts_t *o = b->o;
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
    const bench_opts_t *o = b->o;
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
    const bench_opts_t *o = b->o;
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

/* Opens the rank's device and allocates the buffers (cap bytes each). */
static dt_status_t bench_alloc(bench_t *b, int local_rank, size_t cap) {
    if (b->o->device == DT_DEVICE_CPU) {
        b->in = dt_mem_alloc(DT_MEM_COMM, cap);
        b->out = dt_mem_alloc(DT_MEM_COMM, cap);
        if (!b->in || !b->out) return dt_error(DT_STATUS_NOMEM, "out of host memory for two %zu-byte buffers", cap);
        memset(b->in, 0, cap);
        memset(b->out, 0, cap);
        return DT_STATUS_OK;
    }
    int ngpu = dt_device_count(DT_DEVICE_CUDA);
    dt_device_opts_t opts = {.kind = DT_DEVICE_CUDA, .nthreads = 1, .ordinal = ngpu > 0 ? local_rank % ngpu : 0,
                             .dtype = DT_DTYPE_F32};
    DT_CHECK(dt_device_open(&b->dev, &opts));
    const dt_ops_t *ops = b->dev->ops;
    DT_CHECK(ops->alloc(b->dev, DT_MEM_COMM, cap, &b->in));
    DT_CHECK(ops->alloc(b->dev, DT_MEM_COMM, cap, &b->out));
    DT_CHECK(ops->alloc(b->dev, DT_MEM_COMM, 2 * sizeof(float), (void **)&b->dval));
    b->host = dt_mem_alloc(DT_MEM_COMM, cap);
    if (!b->host) return dt_error(DT_STATUS_NOMEM, "out of host memory for a %zu-byte buffer", cap);
    return ops->synchronize(b->dev);
}

static void bench_free(bench_t *b) {
    free(b->reqs);
    if (b->dev) {
        b->dev->ops->free(b->dev, b->in);
        b->dev->ops->free(b->dev, b->out);
        b->dev->ops->free(b->dev, b->dval);
        dt_mem_free(b->host);
        dt_device_free(b->dev);
    } else {
        dt_mem_free(b->in);
        dt_mem_free(b->out);
    }
}

static void print_header(bench_t *b, int staged, double copy, double host_copy) {
    const bench_opts_t *o = b->o;
    int n = dt_comm_size(b->c);
    char device[200];
    if (b->dev)
        snprintf(device, sizeof device, "device cuda (GPU %d: %s%s)", b->dev->ordinal, b->dev->name,
                 staged ? "; buffers staged through host memory" : "");
    else
        snprintf(device, sizeof device, "device cpu");
    printf("# dtrun bench comm: %s, %d ranks, backend %s, %s, iters %d, warmup %d, %s\n", o->op == DT_COMM_OP_SEND ? "p2p" : dt_comm_op_name(o->op), n,
           dt_comm_backend_name(dt_comm_backend(b->c)), dt_comm_dtype_name(o->dtype), o->iters, o->warmup, device);
    if (!b->dev || staged)
        printf("# memory copy bandwidth (memcpy of 64 MiB, 1 thread, best of 5): %.2f GB/s"
               " - the bound for shared-memory busbw\n",
               host_copy);
    if (b->dev)
        printf("# memory copy bandwidth (device-to-device copy of 64 MiB on GPU %d, best of 5): %.2f GB/s%s\n",
               b->dev->ordinal, copy,
               staged ? " - the GPU's own; staged ops are bound by the host copy above"
                      : " - what NCCL's busbw is judged against on one node");
    printf("#\n# %12s %12s %6s %6s %11s %11s %11s %7s\n", "size(B)", "count", "type", "redop", "time(us)",
           "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    fflush(stdout);
}

static int bench_rank(bench_opts_t *o) {
    dt_comm_config_t cfg;
    if (dt_comm_config_from_env(&cfg) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun bench comm: %s (run under `dtrun [launch flags] bench comm` or use --nproc N)\n",
                dt_error_detail());
        return DT_EXIT_USAGE;
    }
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "dtrun rank %d", cfg.rank);
    dt_log_set_prefix(prefix);
    if (o->lws) { /* nodes of --local-world-size ranks, whatever the launcher said */
        if (cfg.world_size % o->lws) {
            fprintf(stderr, "dtrun bench comm: --local-world-size %d does not divide the world size %d\n", o->lws,
                    cfg.world_size);
            return DT_EXIT_USAGE;
        }
        cfg.local_world_size = o->lws;
        cfg.local_rank = cfg.rank % o->lws;
    }
    int lws = cfg.local_world_size > 0 ? cfg.local_world_size : cfg.world_size;
    int ngpu = o->device == DT_DEVICE_CPU ? 0 : dt_device_count(DT_DEVICE_CUDA);
    if (resolve_device(o, ngpu, lws) != 0) return DT_EXIT_USAGE;
    cfg.backend = (dt_comm_backend_t)o->backend;
    cfg.chunk_bytes = o->chunk;
    cfg.tcp_conns = o->conns;

    bench_t b = {.o = o};
    int rc = DT_EXIT_OK;
    size_t es = dt_comm_dtype_size(o->dtype);
    size_t cap = (o->max / es + (size_t)cfg.world_size + 16) * es;
    if (bench_alloc(&b, cfg.local_rank, cap) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun bench comm: rank %d: %s: %s\n", cfg.rank,
                o->device == DT_DEVICE_CUDA ? "opening the GPU and its buffers" : "buffers", dt_error_detail());
        rc = DT_EXIT_FAILED;
        goto out_free;
    }
    int staged = 0;
    if (b.dev) {
        cfg.stage_dev = b.dev; /* shm/tcp/hier stage through host memory; NCCL ignores it */
        if (lws <= ngpu) cfg.device = b.dev->ordinal; /* a GPU per rank: backend auto picks NCCL */
    }
    if (dt_comm_init(&cfg, &b.c) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun bench comm: rank %d: creating the communicator: %s\n", cfg.rank, dt_error_detail());
        rc = DT_EXIT_NETWORK;
        goto out_free;
    }
    staged = b.dev && dt_comm_backend(b.c) != DT_COMM_BACKEND_NCCL;
    int n = dt_comm_size(b.c), r = dt_comm_rank(b.c);
    if (o->op == DT_COMM_OP_SEND && n < 2) {
        if (r == 0) fprintf(stderr, "dtrun bench comm: --op p2p needs at least 2 ranks (it has %d)\n", n);
        rc = DT_EXIT_USAGE;
        goto out_free_comm;
    }
    double busf = o->op == DT_COMM_OP_ALL_REDUCE   ? 2.0 * (n - 1) / n
                  : o->op == DT_COMM_OP_BROADCAST || o->op == DT_COMM_OP_SEND ? 1.0
                                                  : (double)(n - 1) / n;
    double copy = 0, host_copy = 0;
    if (dt_comm_barrier(b.c) != DT_STATUS_OK) goto out_comm_failed;
    if (r == 0 && b.dev) copy = device_copy_gbps(b.dev);
    if (r == 0 && (!b.dev || staged)) host_copy = memcpy_gbps();
    if (dt_comm_barrier(b.c) != DT_STATUS_OK) goto out_comm_failed;
    if (r == 0) print_header(&b, staged, copy, host_copy);
    size_t total_wrong = 0;
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
        dt_status_t st;
        float wrong = (float)count_wrong(&b, count, &st), all_wrong = 0;
        if (st != DT_STATUS_OK) goto out_comm_failed;
        if (reduce_value(&b, wrong, DT_COMM_SUM, &all_wrong) != DT_STATUS_OK) goto out_comm_failed;
        total_wrong += (size_t)all_wrong;
        size_t bytes = count * es;
        double algbw = (double)bytes / (slowest * 1e-6) / 1e9;
        if (r == 0) {
            printf("  %12zu %12zu %6s %6s %11.2f %11.3f %11.3f %7zu\n", bytes, count, dt_comm_dtype_name(o->dtype),
                   o->op <= DT_COMM_OP_REDUCE_SCATTER ? "sum" : "none", slowest, algbw, algbw * busf,
                   (size_t)all_wrong);
            fflush(stdout);
        }
        size_t next = (size_t)((double)size * o->factor);
        size = next > size ? next : size + 1;
    }
    if (r == 0) printf("# out of bounds values: %zu %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    rc = total_wrong ? DT_EXIT_FAILED : DT_EXIT_OK;
    goto out_free_comm;

out_comm_failed:
    fprintf(stderr, "dtrun bench comm: rank %d: %s\n", r, dt_error_detail());
    rc = DT_EXIT_FAILED;
out_free_comm:
    dt_comm_free(b.c);
out_free:
    bench_free(&b);
    return rc;
}

int dt_bench_comm_main(int argc, char **argv) {
    bench_opts_t o;
    int p = parse_args(argc, argv, &o);
    if (p) return p > 0 ? DT_EXIT_OK : DT_EXIT_USAGE;
    /* Not started by a launcher (no RANK): --nproc launches the ranks. A bad
     * variable is left for the rank to report, as dt_comm_config_from_env does. */
    dt_torchenv_t env;
    if (o.nproc > 0 && dt_torchenv_read(&env) == DT_STATUS_OK && !env.launched) return launch_local(argc, argv, &o);
    return bench_rank(&o);
}

/* hidden: dtrun __bench_comm_rank [flags] (cli/main.c) */
int dt_cmd_bench_comm_rank(int argc, char **argv) { return dt_bench_comm_main(argc, argv); }
