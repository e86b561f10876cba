/*
 * cmd_bench_comm.c - `dtrun [launch flags] bench comm [flags]`: the collective
 * bandwidth table in the style of nccl-tests, printed by rank 0.
 *
 * Each rank runs dt_bench_comm_main (the launcher calls it, or the hidden
 * subcommand `dtrun __bench_comm_rank`). With --nproc N and no RANK in the
 * environment it starts a store on 127.0.0.1 and N local ranks itself.
 *
 * Columns: size (bytes of the full buffer: the input of all_reduce, broadcast
 * and reduce_scatter, the output of all_gather), count (elements of it), type,
 * redop, time (us per op, the slowest rank's mean), algbw = size / time, busbw =
 * algbw * factor (nccl-tests: 2(n-1)/n all_reduce, (n-1)/n reduce_scatter and
 * all_gather, 1 broadcast), #wrong (elements that differ from the expected
 * result in a checked run after the timed ones; exact integer-valued inputs).
 * The memcpy bandwidth of one thread (a 64 MiB copy, best of 5) is measured in
 * the same run and printed as the bound for shared-memory busbw.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "rendezvous/store.h"
#include "runtime/comm.h"

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
} bench_opts_t;

static const char bench_usage[] =
    "usage: dtrun [LAUNCH FLAGS] bench comm [--op all_reduce|reduce_scatter|all_gather|broadcast]\n"
    "         [--min 8] [--max 256M] [--factor 2] [--iters 20] [--warmup 5] [--dtype f32|bf16]\n"
    "         [--backend auto|shm|tcp|hier] [--chunk BYTES] [--conns K]\n"
    "       dtrun __bench_comm_rank --nproc N [--local-world-size L] [same flags]   (local, no launcher)\n";

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
    *o = (bench_opts_t){DT_COMM_OP_ALL_REDUCE, 8, 256u << 20, 2, 20, 5, DT_COMM_F32, DT_COMM_BACKEND_AUTO, 0, 0, 0, 0};
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

/* ---- local launcher (--nproc) ------------------------------------------------------ */

static int spawn_local(int argc, char **argv, const bench_opts_t *o) {
    dt_store_server_t *srv = NULL;
    if (dt_store_server_start("127.0.0.1", 0, &srv) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun bench comm: cannot start a store: %s\n", dt_error_detail());
        return DT_EXIT_NETWORK;
    }
    int port = dt_store_server_port(srv), n = o->nproc, lws = o->lws ? o->lws : n;
    if (n % lws) {
        fprintf(stderr, "dtrun bench comm: --local-world-size %d does not divide --nproc %d\n", lws, n);
        dt_store_server_stop(srv);
        return DT_EXIT_USAGE;
    }
    char **args = calloc((size_t)argc + 2, sizeof(char *));
    int na = 0;
    args[na++] = "dtrun";
    args[na++] = "__bench_comm_rank";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc") || !strcmp(argv[i], "--local-world-size")) {
            i++;
            continue;
        }
        args[na++] = argv[i];
    }
    args[na] = NULL;
    pid_t pids[64];
    char runid[64];
    snprintf(runid, sizeof(runid), "bench%d", (int)getpid());
    for (int r = 0; r < n; r++) {
        pid_t p = fork();
        if (p < 0) {
            perror("fork");
            n = r;
            break;
        }
        if (p == 0) {
            char b[32];
            snprintf(b, sizeof(b), "%d", r), setenv("RANK", b, 1);
            snprintf(b, sizeof(b), "%d", o->nproc), setenv("WORLD_SIZE", b, 1);
            snprintf(b, sizeof(b), "%d", r % lws), setenv("LOCAL_RANK", b, 1);
            snprintf(b, sizeof(b), "%d", lws), setenv("LOCAL_WORLD_SIZE", b, 1);
            snprintf(b, sizeof(b), "%d", port), setenv("MASTER_PORT", b, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("TORCHELASTIC_RUN_ID", runid, 1);
            setenv("TORCHELASTIC_RESTART_COUNT", "0", 1);
            setenv("OMP_NUM_THREADS", "1", 0);
            execv("/proc/self/exe", args);
            fprintf(stderr, "dtrun bench comm: exec /proc/self/exe: %s\n", strerror(errno));
            _exit(DT_EXIT_FAILED);
        }
        pids[r] = p;
    }
    int worst = 0;
    for (int r = 0; r < n; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code > worst) worst = code;
    }
    free(args);
    dt_store_server_stop(srv);
    return worst;
}

/* ---- the measurement ----------------------------------------------------------------- */

static double memcpy_gbps(void) {
    size_t bytes = 64u << 20;
    char *a = dt_mem_alloc(DT_MEM_OTHER, bytes), *b = dt_mem_alloc(DT_MEM_OTHER, bytes);
    if (!a || !b) return 0;
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

static dt_status_t run_op(dt_comm_t *c, const bench_opts_t *o, void *in, void *out, size_t count) {
    switch (o->op) {
    case DT_COMM_OP_ALL_REDUCE: return dt_comm_all_reduce(c, in, out, count, o->dtype, DT_COMM_SUM);
    case DT_COMM_OP_REDUCE_SCATTER: return dt_comm_reduce_scatter(c, in, out, count, o->dtype, DT_COMM_SUM);
    case DT_COMM_OP_ALL_GATHER:
        return dt_comm_all_gather(c, in, out, count / (size_t)dt_comm_size(c), o->dtype);
    case DT_COMM_OP_BROADCAST: return dt_comm_broadcast(c, out, count, o->dtype, 0);
    default: return dt_comm_barrier(c);
    }
}

/* Elements of the checked run that differ from the exact expected values. */
static size_t count_wrong(dt_comm_t *c, const bench_opts_t *o, void *in, void *out, size_t count, dt_status_t *st) {
    int n = dt_comm_size(c), r = dt_comm_rank(c);
    size_t wrong = 0, per = count / (size_t)n;
    size_t nin = o->op == DT_COMM_OP_ALL_GATHER ? per : count;
    for (size_t i = 0; i < nin; i++) set_elem(in, o->dtype, i, input_value(r, i));
    if (o->op == DT_COMM_OP_BROADCAST)
        for (size_t i = 0; i < count; i++) set_elem(out, o->dtype, i, r == 0 ? input_value(0, i) : -1.0f);
    *st = run_op(c, o, in, out, count);
    if (*st != DT_STATUS_OK) return count;
    size_t nout = o->op == DT_COMM_OP_REDUCE_SCATTER ? dt_comm_slice_count(count, n, r)
                  : o->op == DT_COMM_OP_ALL_GATHER   ? per * (size_t)n
                                                     : count;
    size_t off = o->op == DT_COMM_OP_REDUCE_SCATTER ? dt_comm_slice_offset(count, n, r) : 0;
    for (size_t i = 0; i < nout; i++) {
        float want;
        size_t g = off + i;
        if (o->op == DT_COMM_OP_ALL_GATHER)
            want = input_value((int)(i / per), i % per);
        else if (o->op == DT_COMM_OP_BROADCAST)
            want = input_value(0, g);
        else
            want = (float)((g % 13) * (size_t)n + (size_t)n * (size_t)(n - 1) / 2);
        if (get_elem(out, o->dtype, i) != want) wrong++;
    }
    return wrong;
}

static int bench_rank(const bench_opts_t *o) {
    dt_comm_config_t cfg;
    if (dt_comm_config_from_env(&cfg) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun bench comm: %s (run under `dtrun [launch flags] bench comm` or use --nproc N)\n",
                dt_error_detail());
        return DT_EXIT_USAGE;
    }
    cfg.backend = (dt_comm_backend_t)o->backend;
    cfg.chunk_bytes = o->chunk;
    cfg.tcp_conns = o->conns;
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "dtrun rank %d", cfg.rank);
    dt_log_set_prefix(prefix);
    dt_comm_t *c = NULL;
    if (dt_comm_init(&cfg, &c) != DT_STATUS_OK) {
        fprintf(stderr, "dtrun bench comm: rank %d: creating the communicator: %s\n", cfg.rank, dt_error_detail());
        return DT_EXIT_NETWORK;
    }
    int n = dt_comm_size(c), r = dt_comm_rank(c);
    size_t es = dt_comm_dtype_size(o->dtype);
    double busf = o->op == DT_COMM_OP_ALL_REDUCE   ? 2.0 * (n - 1) / n
                  : o->op == DT_COMM_OP_BROADCAST ? 1.0
                                                  : (double)(n - 1) / n;
    size_t cap = o->max / es + (size_t)n + 16;
    void *in = dt_mem_alloc(DT_MEM_COMM, cap * es), *out = dt_mem_alloc(DT_MEM_COMM, cap * es);
    int rc = DT_EXIT_OK;
    if (!in || !out) {
        fprintf(stderr, "dtrun bench comm: out of memory for %zu-byte buffers\n", cap * es);
        rc = DT_EXIT_FAILED;
        goto out_free;
    }
    memset(in, 0, cap * es);
    memset(out, 0, cap * es);
    double copy = 0;
    if (dt_comm_barrier(c) != DT_STATUS_OK) goto out_comm_failed;
    if (r == 0) copy = memcpy_gbps();
    if (dt_comm_barrier(c) != DT_STATUS_OK) goto out_comm_failed;
    if (r == 0) {
        printf("# dtrun bench comm: %s, %d ranks, backend %s, %s, iters %d, warmup %d\n", dt_comm_op_name(o->op), n,
               dt_comm_backend_name(dt_comm_backend(c)), dt_comm_dtype_name(o->dtype), o->iters, o->warmup);
        printf("# memory copy bandwidth (memcpy of 64 MiB, 1 thread, best of 5): %.2f GB/s"
               " - the bound for shared-memory busbw\n#\n",
               copy);
        printf("# %12s %12s %6s %6s %11s %11s %11s %7s\n", "size(B)", "count", "type", "redop", "time(us)",
               "algbw(GB/s)", "busbw(GB/s)", "#wrong");
        fflush(stdout);
    }
    size_t total_wrong = 0;
    for (size_t size = o->min; size <= o->max;) {
        size_t count = size / es;
        if (o->op == DT_COMM_OP_ALL_GATHER) count = count / (size_t)n * (size_t)n;
        if (count == 0) count = o->op == DT_COMM_OP_ALL_GATHER ? (size_t)n : 1;
        for (int w = 0; w < o->warmup; w++)
            if (run_op(c, o, in, out, count) != DT_STATUS_OK) goto out_comm_failed;
        if (dt_comm_barrier(c) != DT_STATUS_OK) goto out_comm_failed;
        double t0 = dt_now_s();
        for (int it = 0; it < o->iters; it++)
            if (run_op(c, o, in, out, count) != DT_STATUS_OK) goto out_comm_failed;
        float us = (float)((dt_now_s() - t0) / o->iters * 1e6), slowest = 0;
        if (dt_comm_all_reduce(c, &us, &slowest, 1, DT_COMM_F32, DT_COMM_MAX) != DT_STATUS_OK) goto out_comm_failed;
        dt_status_t st;
        float wrong = (float)count_wrong(c, o, in, out, count, &st), all_wrong = 0;
        if (st != DT_STATUS_OK) goto out_comm_failed;
        if (dt_comm_all_reduce(c, &wrong, &all_wrong, 1, DT_COMM_F32, DT_COMM_SUM) != DT_STATUS_OK)
            goto out_comm_failed;
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
    goto out_free;

out_comm_failed:
    fprintf(stderr, "dtrun bench comm: rank %d: %s\n", r, dt_error_detail());
    rc = DT_EXIT_FAILED;
out_free:
    dt_mem_free(in);
    dt_mem_free(out);
    dt_comm_free(c);
    return rc;
}

int dt_bench_comm_main(int argc, char **argv) {
    bench_opts_t o;
    int p = parse_args(argc, argv, &o);
    if (p) return p > 0 ? DT_EXIT_OK : DT_EXIT_USAGE;
    const char *rank = getenv("RANK");
    if (o.nproc > 0 && (!rank || !*rank)) return spawn_local(argc, argv, &o);
    return bench_rank(&o);
}

/* hidden: dtrun __bench_comm_rank [flags] (cli/main.c) */
int dt_cmd_bench_comm_rank(int argc, char **argv) { return dt_bench_comm_main(argc, argv); }
