/*
 * comm_bench.h - the collective benchmark (`dtrun bench comm`, in the style of
 * nccl-tests): one rank's timed ops over a range of sizes, each size checked
 * exactly after the timed runs, and the memory copy bandwidth its busbw is judged
 * against. cli/cmd_bench_comm.c parses the flags, launches the ranks and prints
 * what rank 0 reports here (dt_comm_bench_report).
 *
 * Per size: time is the slowest rank's mean per op (us), algbw = size / time,
 * busbw = algbw * factor (nccl-tests: 2(n-1)/n all_reduce, (n-1)/n reduce_scatter
 * and all_gather, 1 broadcast and p2p), #wrong the elements that differ from the
 * expected result of exact integer-valued inputs, summed over the ranks. p2p
 * (op DT_COMM_OP_SEND) is a ping-pong between ranks 0 and 1, time half the round
 * trip. With the cuda device the buffers are device memory (GPU LOCAL_RANK %
 * visible GPUs); NCCL ops are issued asynchronously (at most 64 in flight) and
 * waited for at the end, as nccl-tests does; host backends stage device buffers
 * through host memory (comm.h stage_dev).
 */
#ifndef DT_RUNTIME_COMM_BENCH_H
#define DT_RUNTIME_COMM_BENCH_H

#include <stddef.h>

#include "common/status.h"
#include "kernels/kernels.h" /* defines: dt_device_t */
#include "runtime/comm/comm.h"

/* --device unset: cuda when a GPU is visible, else cpu */
#define DT_COMM_BENCH_DEVICE_DEFAULT (-1)

/* The flags' bounds (cli/cmd_bench_comm.c refuses more, exit 2, before any rank
 * starts): sizes up to 64 GiB (two buffers of it per rank), chunks up to 1 GiB, a
 * factor up to 1024, up to a million timed or warm-up iterations. */
#define DT_COMM_BENCH_MAX_BYTES (64ull << 30)
#define DT_COMM_BENCH_MAX_CHUNK (1ull << 30)
#define DT_COMM_BENCH_MAX_FACTOR 1024.0
#define DT_COMM_BENCH_MAX_ITERS 1000000

typedef struct dt_comm_bench_opts {
    dt_comm_op_t op; /* DT_COMM_OP_SEND: p2p */
    size_t min, max; /* bytes of the full buffer */
    double factor;   /* the next size: size x factor */
    int iters, warmup;
    dt_comm_dtype_t dtype;
    int backend;     /* dt_comm_backend_t */
    int nproc, lws;  /* a local launch of nproc ranks; nodes of lws ranks (0: as launched) */
    size_t chunk;    /* the communicator's chunk bytes (0: its default) */
    int conns;       /* TCP connections (0: its default) */
    int device;      /* DT_COMM_BENCH_DEVICE_DEFAULT or a dt_device_kind_t */
} dt_comm_bench_opts;

/* What rank 0 reports before the first size. */
typedef struct dt_comm_bench_info {
    int n_ranks;
    dt_comm_backend_t backend;
    int gpu;                /* 1: buffers on GPU `ordinal` (`gpu_name`) */
    int ordinal;
    const char *gpu_name;
    int staged;             /* device buffers staged through host memory */
    double copy_gbps;       /* the GPU's device-to-device copy (gpu) */
    double host_copy_gbps;  /* memcpy of one thread (cpu, or staged) */
} dt_comm_bench_info;

/* One size, as rank 0 reports it. */
typedef struct dt_comm_bench_line {
    size_t bytes, count;
    double time_us, algbw, busbw; /* GB/s */
    size_t wrong;
} dt_comm_bench_line;

typedef struct dt_comm_bench_report {
    void (*header)(void *ctx, const dt_comm_bench_opts *o, const dt_comm_bench_info *info);
    void (*line)(void *ctx, const dt_comm_bench_opts *o, const dt_comm_bench_line *l);
    void *ctx;
} dt_comm_bench_report;

/* Where a run failed (dt_comm_bench_run's result.failed). */
typedef enum dt_comm_bench_fail {
    DT_COMM_BENCH_OK = 0,
    DT_COMM_BENCH_FAIL_USAGE,  /* the options do not fit the world (p2p on one rank) */
    DT_COMM_BENCH_FAIL_ALLOC,  /* the device or its buffers */
    DT_COMM_BENCH_FAIL_INIT,   /* creating the communicator */
    DT_COMM_BENCH_FAIL_RUN,    /* an op */
} dt_comm_bench_fail_t;

typedef struct dt_comm_bench_result {
    dt_comm_bench_fail_t failed;
    int rank;           /* this rank in the communicator (-1 before it exists) */
    size_t total_wrong; /* over every size and rank */
} dt_comm_bench_result;

/* The backend the communicator will be asked for: o->backend, else DTRUN_COMM (as
 * dt_comm_init reads it), else auto. */
int dt_comm_bench_requested_backend(const dt_comm_bench_opts *o);
/* Resolves o->device from ngpu visible GPUs and checks it against the backend and
 * lws ranks per node: DT_STATUS_USAGE saying why not. */
dt_status_t dt_comm_bench_resolve_device(dt_comm_bench_opts *o, int ngpu, int lws);
/* Runs the benchmark on this rank with communicator config cfg (its backend, chunk
 * and connections set from o here; o->device resolved). Rank 0 reports through rep.
 * An error's detail is the message (from "rank R: " on for ALLOC, INIT and RUN). */
dt_status_t dt_comm_bench_run(const dt_comm_bench_opts *o, dt_comm_config_t *cfg, int lws,
                              const dt_comm_bench_report *rep, dt_comm_bench_result *res);

/* The preflight's health check of a job's communicator, run by every rank before
 * the first step (and by `dtrun check`'s ranks): an all-reduce of bytes over the
 * world (checked exactly), the same within each node (every node at once), and a
 * ping-pong between each node's first rank and node 0's (one node at a time): nodes
 * are lws consecutive ranks. Rank 0 gets res->report (malloc'ed lines: the busbw of
 * each, per node, errors and warnings) and every rank res->bad: the figures under
 * min_busbw_gbps (0: none; without a floor a node under half the nodes' median is
 * a warning) and nodes whose results were wrong. dev: the buffers' GPU (NULL: host). */
typedef struct dt_comm_health_opts {
    size_t bytes;          /* of the all-reduce's buffer */
    int iters;             /* timed ops of each measurement */
    double min_busbw_gbps; /* the floor, GB/s (0: none) */
} dt_comm_health_opts;

typedef struct dt_comm_health_result {
    double busbw_gbps; /* the world's all-reduce (rank 0) */
    int bad;           /* errors found (every rank) */
    char *report;      /* rank 0: the lines to print (free) */
} dt_comm_health_result;

dt_status_t dt_comm_health_run(dt_comm_t *world, dt_device_t *dev, int lws, const dt_comm_health_opts *ho,
                               dt_comm_health_result *res);

#endif /* DT_RUNTIME_COMM_BENCH_H */
