/*
 * test_comm.c - the communicator with real processes: every test starts a store
 * on 127.0.0.1 (port 0) and forks one process per rank, each creating its
 * communicator through the store as a worker would.
 *
 * Results are compared bitwise against a serial reference that sums in the
 * backend's documented order (shm: rank order; tcp: ring order; hier: node then
 * ring), so the checks also pin determinism.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/mem.h"
#include "rendezvous/store.h"
#include "runtime/comm.h"

/* ---- harness --------------------------------------------------------------- */

typedef struct group {
    int n, lws;
    dt_comm_backend_t backend;
    double timeout_s;
    char run_id[64];
    int round;
    size_t chunk;
    double limit_s;
} group_t;

typedef int (*rank_fn_t)(dt_comm_t *comm, const group_t *g, void *arg);

static dt_store_server_t *srv;

static int store_port(void) {
    if (!srv) cr_assert_eq(dt_store_server_start("127.0.0.1", 0, &srv), DT_STATUS_OK, "store: %s", dt_error_detail());
    return dt_store_server_port(srv);
}

static group_t group(int n, dt_comm_backend_t b) {
    group_t g = {n, n, b, 30.0, "", 0, 0, 60.0};
    snprintf(g.run_id, sizeof(g.run_id), "t%d", (int)getpid());
    return g;
}

static pid_t spawn_rank(const group_t *g, int rank, rank_fn_t fn, void *arg) {
    int port = store_port();
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid) return pid;
    dt_comm_config_t cfg = {0};
    cfg.store_host = "127.0.0.1";
    cfg.store_port = port;
    cfg.run_id = g->run_id;
    cfg.restart_round = g->round;
    cfg.rank = rank;
    cfg.world_size = g->n;
    cfg.local_world_size = g->lws;
    cfg.local_rank = rank % g->lws;
    cfg.backend = g->backend;
    cfg.timeout_s = g->timeout_s;
    cfg.chunk_bytes = g->chunk;
    cfg.device = -1;
    dt_comm_t *comm = NULL;
    if (dt_comm_init(&cfg, &comm) != DT_STATUS_OK) {
        fprintf(stderr, "rank %d: dt_comm_init: %s\n", rank, dt_error_detail());
        _exit(90);
    }
    int rc = fn(comm, g, arg);
    dt_comm_free(comm);
    _exit(rc);
}

/* Runs fn on n ranks; codes[i] = exit code (128+signal, 124 if over the limit). */
static void run_group(const group_t *g, rank_fn_t fn, void *arg, int *codes) {
    pid_t pids[16];
    for (int i = 0; i < g->n; i++) pids[i] = spawn_rank(g, i, fn, arg);
    double deadline = dt_now_s() + g->limit_s;
    int left = g->n;
    for (int i = 0; i < g->n; i++) codes[i] = -1;
    while (left > 0) {
        for (int i = 0; i < g->n; i++) {
            if (codes[i] != -1) continue;
            int status;
            if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
                codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                left--;
            }
        }
        if (left && dt_now_s() > deadline) {
            for (int i = 0; i < g->n; i++)
                if (codes[i] == -1) {
                    kill(pids[i], SIGKILL);
                    waitpid(pids[i], NULL, 0);
                    codes[i] = 124;
                }
            break;
        }
        if (left) dt_sleep_ms(2);
    }
}

static void expect_all_ok(const group_t *g, rank_fn_t fn, void *arg) {
    int codes[16];
    run_group(g, fn, arg, codes);
    for (int i = 0; i < g->n; i++)
        cr_assert_eq(codes[i], 0, "rank %d of %d (%s) exited %d", i, g->n, dt_comm_backend_name(g->backend), codes[i]);
}

/* ---- inputs and the serial reference ------------------------------------------ */

static float val(int rank, size_t i, uint32_t salt, dt_comm_dtype_t dt) {
    uint64_t h = ((uint64_t)(unsigned)rank << 40) ^ ((uint64_t)i * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)salt << 20);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    float f = (float)((h >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
    return dt == DT_COMM_BF16 ? dt_comm_bf16_to_f32(dt_comm_f32_to_bf16(f)) : f;
}

static void fill(void *buf, int rank, size_t count, uint32_t salt, dt_comm_dtype_t dt) {
    for (size_t i = 0; i < count; i++) {
        float f = val(rank, i, salt, dt);
        if (dt == DT_COMM_F32)
            ((float *)buf)[i] = f;
        else
            ((uint16_t *)buf)[i] = dt_comm_f32_to_bf16(f);
    }
}

static int slice_index(size_t count, int n, size_t i) {
    size_t q = count / (size_t)n, rem = count % (size_t)n;
    if (i < rem * (q + 1)) return (int)(i / (q + 1));
    return (int)(rem + (i - rem * (q + 1)) / q);
}

/* Sum of element i over ranks in the backend's order (fp32). */
static float ref_sum(const group_t *g, dt_comm_backend_t b, size_t count, size_t i, uint32_t salt,
                     dt_comm_dtype_t dt, dt_comm_redop_t op) {
    int n = g->n;
    float v[16];
    for (int k = 0; k < n; k++) v[k] = val(k, i, salt, dt);
    float acc;
    if (op == DT_COMM_MAX) {
        acc = v[0];
        for (int k = 1; k < n; k++) acc = acc > v[k] ? acc : v[k];
        return acc;
    }
    if (b == DT_COMM_BACKEND_SHM || n == 1) {
        acc = v[0];
        for (int k = 1; k < n; k++) acc += v[k];
    } else if (b == DT_COMM_BACKEND_TCP) {
        int j = slice_index(count, n, i);
        acc = v[(j + 1) % n];
        for (int t = 2; t <= n; t++) acc += v[(j + t) % n];
    } else { /* hier */
        int L = g->lws, N = n / L;
        size_t q = (count + (size_t)L - 1) / (size_t)L;
        int j = slice_index(q, N, i % q);
        float s[16];
        for (int k = 0; k < N; k++) {
            s[k] = v[k * L];
            for (int l = 1; l < L; l++) s[k] += v[k * L + l];
        }
        acc = s[(j + 1) % N];
        for (int t = 2; t <= N; t++) acc += s[(j + t) % N];
    }
    if (op == DT_COMM_AVG) acc /= (float)n;
    return acc;
}

static uint32_t bits_at(const void *buf, size_t i, dt_comm_dtype_t dt) {
    if (dt == DT_COMM_BF16) return ((const uint16_t *)buf)[i];
    uint32_t u;
    memcpy(&u, (const float *)buf + i, 4);
    return u;
}

static uint32_t ref_bits(float f, dt_comm_dtype_t dt) {
    if (dt == DT_COMM_BF16) return dt_comm_f32_to_bf16(f);
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---- every op against the reference ---------------------------------------------- */

static const size_t counts[] = {0, 1, 7, 13, 1009, 4099, 65537, 524291};

static int fail_msg(const group_t *g, dt_comm_t *c, const char *what, size_t count, dt_comm_dtype_t dt, size_t i,
                    uint32_t got, uint32_t want) {
    fprintf(stderr, "rank %d/%d %s: %s count %zu %s: element %zu is 0x%08x, expected 0x%08x\n", dt_comm_rank(c),
            g->n, dt_comm_backend_name(dt_comm_backend(c)), what, count, dt_comm_dtype_name(dt), i, got, want);
    return 1;
}

static int call_failed(dt_comm_t *c, const char *what, size_t count) {
    fprintf(stderr, "rank %d: %s count %zu failed: %s\n", dt_comm_rank(c), what, count, dt_error_detail());
    return 2;
}

static int every_op(dt_comm_t *c, const group_t *g, void *arg) {
    int n = dt_comm_size(c), r = dt_comm_rank(c);
    dt_comm_backend_t b = dt_comm_backend(c);
    size_t maxc = counts[sizeof(counts) / sizeof(counts[0]) - 1];
    uint8_t *in = dt_mem_alloc(DT_MEM_OTHER, (maxc + 8) * 4 * (size_t)n);
    uint8_t *out = dt_mem_alloc(DT_MEM_OTHER, (maxc + 8) * 4 * (size_t)n);
    for (int d = 0; d < 2; d++) {
        dt_comm_dtype_t dt = d ? DT_COMM_BF16 : DT_COMM_F32;
        size_t es = dt_comm_dtype_size(dt);
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
            size_t count = counts[ci];
            /* all_reduce: sum out of place, avg in place, max out of place */
            for (int op = 0; op < 3; op++) {
                uint32_t salt = (uint32_t)(ci * 16 + op * 4 + d);
                dt_comm_redop_t redop = (dt_comm_redop_t)op;
                fill(in, r, count, salt, dt);
                void *dst = op == DT_COMM_AVG ? in : out;
                if (dt_comm_all_reduce(c, in, dst, count, dt, redop) != DT_STATUS_OK)
                    return call_failed(c, "all_reduce", count);
                for (size_t i = 0; i < count; i++) {
                    uint32_t want = ref_bits(ref_sum(g, b, count, i, salt, dt, redop), dt);
                    if (bits_at(dst, i, dt) != want)
                        return fail_msg(g, c, dt_comm_redop_name(redop), count, dt, i, bits_at(dst, i, dt), want);
                }
            }
            /* reduce_scatter: sum out of place, avg in place */
            for (int op = 0; op < 2; op++) {
                uint32_t salt = (uint32_t)(ci * 16 + 8 + op * 4 + d);
                fill(in, r, count, salt, dt);
                size_t off = dt_comm_slice_offset(count, n, r), len = dt_comm_slice_count(count, n, r);
                void *dst = op ? (void *)(in + off * es) : (void *)out;
                if (dt_comm_reduce_scatter(c, in, dst, count, dt, (dt_comm_redop_t)op) != DT_STATUS_OK)
                    return call_failed(c, "reduce_scatter", count);
                for (size_t i = 0; i < len; i++) {
                    uint32_t want = ref_bits(ref_sum(g, b, count, off + i, salt, dt, (dt_comm_redop_t)op), dt);
                    if (bits_at(dst, i, dt) != want)
                        return fail_msg(g, c, "reduce_scatter", count, dt, off + i, bits_at(dst, i, dt), want);
                }
            }
            /* all_gather out of place (count per rank), then in place */
            for (int inplace = 0; inplace < 2; inplace++) {
                uint32_t salt = (uint32_t)(ci * 16 + 12 + inplace * 2 + d);
                void *src = inplace ? (void *)(out + (size_t)r * count * es) : (void *)in;
                fill(src, r, count, salt, dt);
                if (dt_comm_all_gather(c, src, out, count, dt) != DT_STATUS_OK)
                    return call_failed(c, "all_gather", count);
                for (int k = 0; k < n; k++)
                    for (size_t i = 0; i < count; i++) {
                        uint32_t want = ref_bits(val(k, i, salt, dt), dt);
                        if (bits_at(out, (size_t)k * count + i, dt) != want)
                            return fail_msg(g, c, "all_gather", count, dt, (size_t)k * count + i,
                                            bits_at(out, (size_t)k * count + i, dt), want);
                    }
            }
            /* broadcast from the last rank */
            uint32_t salt = (uint32_t)(ci * 16 + 15);
            fill(out, r, count, salt, dt);
            if (dt_comm_broadcast(c, out, count, dt, n - 1) != DT_STATUS_OK) return call_failed(c, "broadcast", count);
            for (size_t i = 0; i < count; i++) {
                uint32_t want = ref_bits(val(n - 1, i, salt, dt), dt);
                if (bits_at(out, i, dt) != want) return fail_msg(g, c, "broadcast", count, dt, i, bits_at(out, i, dt), want);
            }
            if (dt_comm_barrier(c) != DT_STATUS_OK) return call_failed(c, "barrier", 0);
        }
    }
    dt_mem_free(in);
    dt_mem_free(out);
    return 0;
}

Test(comm_shm, every_op_world_1_2) {
    group_t g = group(1, DT_COMM_BACKEND_SHM);
    expect_all_ok(&g, every_op, NULL);
    g = group(2, DT_COMM_BACKEND_SHM);
    g.round = 1;
    expect_all_ok(&g, every_op, NULL);
}

Test(comm_shm, every_op_world_3) {
    group_t g = group(3, DT_COMM_BACKEND_SHM);
    g.chunk = 64 * 1024; /* more rounds per op */
    expect_all_ok(&g, every_op, NULL);
}

Test(comm_shm, every_op_world_4) {
    group_t g = group(4, DT_COMM_BACKEND_SHM);
    expect_all_ok(&g, every_op, NULL);
}

Test(comm_tcp, every_op_world_1_2) {
    group_t g = group(1, DT_COMM_BACKEND_TCP);
    expect_all_ok(&g, every_op, NULL);
    g = group(2, DT_COMM_BACKEND_TCP);
    g.round = 1;
    expect_all_ok(&g, every_op, NULL);
}

Test(comm_tcp, every_op_world_3) {
    group_t g = group(3, DT_COMM_BACKEND_TCP);
    expect_all_ok(&g, every_op, NULL);
}

Test(comm_tcp, every_op_world_4_two_conns) {
    group_t g = group(4, DT_COMM_BACKEND_TCP);
    setenv("DTRUN_COMM_TCP_CONNS", "2", 1);
    expect_all_ok(&g, every_op, NULL);
}

Test(comm_hier, every_op_two_nodes_of_two) {
    group_t g = group(4, DT_COMM_BACKEND_HIER);
    g.lws = 2;
    expect_all_ok(&g, every_op, NULL);
}
