/*
 * cmd_bench_comm.c - `dtrun [launch flags] bench comm [flags]`: the collective
 * bandwidth table in the style of nccl-tests, printed by rank 0. This file parses
 * the flags, launches the ranks and prints; the measurement is
 * runtime/comm/comm_bench.c's.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h" /* defines: dt_arg_int, dt_arg_double, dt_arg_bytes */
#include "cli/commands.h"
#include "common/gpuinfo.h" /* defines: dt_gpuinfo_count */
#include "common/log.h"
#include "common/meminfo.h" /* defines: dt_meminfo_host_available */
#include "common/mem.h"
#include "common/torchenv.h"
#include "kernels/kernels.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/comm_bench.h" /* defines: dt_comm_bench_run */
#include "runtime/launch/launch_args.h"

extern char **environ;

typedef dt_comm_bench_opts bench_opts_t;

static const char bench_usage[] =
    "usage: dtrun [LAUNCH FLAGS] bench comm [--op all_reduce|reduce_scatter|all_gather|broadcast|p2p]\n"
    "         [--min 8] [--max 256M] [--factor 2] [--iters 20] [--warmup 5] [--dtype f32|bf16]\n"
    "         [--device cpu|cuda] [--backend auto|shm|tcp|hier|nccl] [--chunk BYTES] [--conns K]\n"
    "  bounds: --min/--max 1..64G, --factor (1, 1024], --iters 1..1e6, --warmup 0..1e6, --chunk 0..1G\n"
    "       dtrun __bench_comm_rank --nproc N [--local-world-size L] [same flags]   (one node, no launch flags)\n"
    "  --device: default cuda when a GPU is visible, else cpu; with cuda each rank uses GPU\n"
    "  LOCAL_RANK % GPUs; --backend nccl needs a GPU per rank (ranks sharing a GPU stage\n"
    "  device buffers through host memory over shm/tcp/hier)\n";

static int parse_args(int argc, char **argv, bench_opts_t *o) {
    *o = (bench_opts_t){DT_COMM_OP_ALL_REDUCE, 8, 256u << 20, 2, 20, 5, DT_COMM_F32, DT_COMM_BACKEND_AUTO, 0, 0, 0,
                        0, DT_COMM_BENCH_DEVICE_DEFAULT};
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
        const char *want = NULL; /* what a number flag takes, said when it is bad */
        if (!strcmp(a, "--op")) {
            if (!strcmp(v, "all_reduce")) o->op = DT_COMM_OP_ALL_REDUCE;
            else if (!strcmp(v, "reduce_scatter")) o->op = DT_COMM_OP_REDUCE_SCATTER;
            else if (!strcmp(v, "all_gather")) o->op = DT_COMM_OP_ALL_GATHER;
            else if (!strcmp(v, "broadcast")) o->op = DT_COMM_OP_BROADCAST;
            else if (!strcmp(v, "p2p")) o->op = DT_COMM_OP_SEND; /* ping-pong between ranks 0 and 1 */
            else bad = 1;
        } else if (!strcmp(a, "--min")) {
            bad = dt_arg_bytes(v, 1, DT_COMM_BENCH_MAX_BYTES, &o->min);
            want = "bytes in [1, 64G]";
        } else if (!strcmp(a, "--max")) {
            bad = dt_arg_bytes(v, 1, DT_COMM_BENCH_MAX_BYTES, &o->max);
            want = "bytes in [1, 64G]";
        } else if (!strcmp(a, "--factor")) {
            bad = dt_arg_double(v, 1.0, DT_COMM_BENCH_MAX_FACTOR, &o->factor) || !(o->factor > 1.0);
            want = "a number in (1, 1024]";
        } else if (!strcmp(a, "--iters")) {
            bad = dt_arg_int(v, 1, DT_COMM_BENCH_MAX_ITERS, &o->iters);
            want = "a count in [1, 1000000]";
        } else if (!strcmp(a, "--warmup")) {
            bad = dt_arg_int(v, 0, DT_COMM_BENCH_MAX_ITERS, &o->warmup);
            want = "a count in [0, 1000000]";
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
            bad = dt_arg_int(v, 1, 64, &o->nproc);
            want = "a count in [1, 64]";
        } else if (!strcmp(a, "--local-world-size")) {
            bad = dt_arg_int(v, 1, 64, &o->lws);
            want = "a count in [1, 64]";
        } else if (!strcmp(a, "--chunk")) {
            bad = dt_arg_bytes(v, 0, DT_COMM_BENCH_MAX_CHUNK, &o->chunk);
            want = "bytes in [0, 1G] (0: the backend's default)";
        } else if (!strcmp(a, "--conns")) {
            bad = dt_arg_int(v, 1, 8, &o->conns);
            want = "a count in [1, 8]";
        } else {
            fprintf(stderr, "dtrun bench comm: unknown flag %s\n%s", a, bench_usage);
            return -1;
        }
        if (bad) {
            if (want) fprintf(stderr, "dtrun bench comm: bad value for %s: \"%s\" (expected %s)\n", a, v, want);
            else fprintf(stderr, "dtrun bench comm: bad value for %s: \"%s\"\n", a, v);
            return -1;
        }
    }
    if (o->min < 1 || o->max < o->min) {
        fprintf(stderr, "dtrun bench comm: need 1 <= --min <= --max\n");
        return -1;
    }
    return 0;
}

/* Resolves --device (comm_bench.h); prints why not and returns -1. */
static int resolve_device(bench_opts_t *o, int ngpu, int lws) {
    if (dt_comm_bench_resolve_device(o, ngpu, lws) == DT_STATUS_OK) return 0;
    fprintf(stderr, "dtrun bench comm: %s\n", dt_error_detail());
    return -1;
}

/* On the cpu device every rank of the node allocates two buffers of --max bytes
 * up front: refuse (exit 2, before any rank starts) what the host cannot hold. */
static int check_host_memory(const bench_opts_t *o, int lws) {
    if (o->device != DT_DEVICE_CPU) return 0;
    const char *what = "";
    double avail = dt_meminfo_host_available(&what), need = 2.0 * (double)o->max * lws;
    if (avail <= 0 || need <= avail) return 0;
    fprintf(stderr, "dtrun bench comm: --max %zu bytes: %d rank(s) x 2 buffers of it need %.1f MiB, more than the "
            "%.1f MiB %s\n", o->max, lws, need / (1 << 20), avail / (1 << 20), what);
    return -1;
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
    if (check_host_memory(&o, local_world_size) != 0) return DT_EXIT_USAGE;
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
    if (check_host_memory(&checked, lws) != 0) return DT_EXIT_USAGE;
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

/* ---- rank 0's table (the measurement is runtime/comm/comm_bench.c's) ---------------- */

static void print_header(void *ctx, const bench_opts_t *o, const dt_comm_bench_info *in) {
    char device[200];
    if (in->gpu)
        snprintf(device, sizeof device, "device cuda (GPU %d: %s%s)", in->ordinal, in->gpu_name,
                 in->staged ? "; buffers staged through host memory" : "");
    else
        snprintf(device, sizeof device, "device cpu");
    printf("# dtrun bench comm: %s, %d ranks, backend %s, %s, iters %d, warmup %d, %s\n", o->op == DT_COMM_OP_SEND ? "p2p" : dt_comm_op_name(o->op), in->n_ranks,
           dt_comm_backend_name(in->backend), dt_comm_dtype_name(o->dtype), o->iters, o->warmup, device);
    if (!in->gpu || in->staged)
        printf("# memory copy bandwidth (memcpy of 64 MiB, 1 thread, best of 5): %.2f GB/s"
               " - the bound for shared-memory busbw\n",
               in->host_copy_gbps);
    if (in->gpu)
        printf("# memory copy bandwidth (device-to-device copy of 64 MiB on GPU %d, best of 5): %.2f GB/s%s\n",
               in->ordinal, in->copy_gbps,
               in->staged ? " - the GPU's own; staged ops are bound by the host copy above"
                          : " - what NCCL's busbw is judged against on one node");
    printf("#\n# %12s %12s %6s %6s %11s %11s %11s %7s\n", "size(B)", "count", "type", "redop", "time(us)",
           "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    fflush(stdout);
}

static void print_line(void *ctx, const bench_opts_t *o, const dt_comm_bench_line *l) {
    printf("  %12zu %12zu %6s %6s %11.2f %11.3f %11.3f %7zu\n", l->bytes, l->count, dt_comm_dtype_name(o->dtype),
           o->op <= DT_COMM_OP_REDUCE_SCATTER ? "sum" : "none", l->time_us, l->algbw, l->busbw, l->wrong);
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
    dt_comm_bench_report rep = {print_header, print_line, NULL};
    dt_comm_bench_result res;
    if (dt_comm_bench_run(o, &cfg, lws, &rep, &res) != DT_STATUS_OK) {
        if (res.failed != DT_COMM_BENCH_FAIL_USAGE || res.rank == 0)
            fprintf(stderr, "dtrun bench comm: %s\n", dt_error_detail());
        return res.failed == DT_COMM_BENCH_FAIL_USAGE  ? DT_EXIT_USAGE
               : res.failed == DT_COMM_BENCH_FAIL_INIT ? DT_EXIT_NETWORK
                                                       : DT_EXIT_FAILED;
    }
    if (res.rank == 0) printf("# out of bounds values: %zu %s\n", res.total_wrong, res.total_wrong ? "FAILED" : "OK");
    return res.total_wrong ? DT_EXIT_FAILED : DT_EXIT_OK;
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
