/*
 * comm_harness.h - what the communicator tests share (test_comm.c,
 * test_comm_faults.c): a store on 127.0.0.1, rank processes that are this test
 * binary fork()ed and exec()ed, a fake CUDA device whose memory only its own copy
 * op may touch, deterministic inputs and the serial reference each backend's
 * documented summation order gives. Each test file defines rank_fns[] (the rank
 * functions an exec'd rank can run) with rank_fn_index and rank_fn_at.
 */
#ifndef DT_TESTS_COMM_HARNESS_H
#define DT_TESTS_COMM_HARNESS_H

#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/mem.h"
#include "kernels/kernels.h"
#include "rendezvous/store.h"
#include "runtime/comm/comm.h"

/* Not every test file uses every helper. */
#pragma GCC diagnostic ignored "-Wunused-function"

/* ---- harness --------------------------------------------------------------- */

typedef struct group {
    int n, lws;
    dt_comm_backend_t backend;
    double timeout_s;
    char run_id[64];
    int round;
    size_t chunk;
    double limit_s;
    int staged; /* buffers in the fake GPU's memory, staged through the host */
} group_t;

typedef int (*rank_fn_t)(dt_comm_t *comm, const group_t *g, void *arg);

static dt_store_server_t *srv;

static int store_port(void) {
    if (!srv) cr_assert_eq(dt_store_server_start("127.0.0.1", 0, &srv), DT_STATUS_OK, "store: %s", dt_error_detail());
    return dt_store_server_port(srv);
}

static group_t group(int n, dt_comm_backend_t b) {
    group_t g = {n, n, b, 30.0, "", 0, 0, 60.0, 0};
    snprintf(g.run_id, sizeof(g.run_id), "t%d", (int)getpid());
    return g;
}

/* ---- a fake CUDA device ------------------------------------------------------------
 * For host staging (dt_comm_config_t.stage_dev) without a GPU: a dt_device_t of
 * kind CUDA whose op table is the CPU backend's with copy and set replaced. Its
 * "device memory" is an arena kept PROT_NONE except inside those two ops, so a
 * communicator that touched a device pointer directly would crash; the ops
 * check that each pointer lies on the side its copy kind says and count the
 * calls and bytes of each kind. One per rank process, made after the fork. */

typedef struct fake_gpu {
    dt_device_t dev;
    dt_device_t *cpu;
    dt_ops_t ops;
    uint8_t *arena;
    size_t arena_bytes, used;
    pthread_mutex_t mu;
    long calls[4];   /* by dt_copy_kind_t */
    size_t bytes[4];
} fake_gpu_t;

static fake_gpu_t gpu = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int in_arena(const void *p, size_t bytes) {
    const uint8_t *q = p;
    return q >= gpu.arena && q + bytes <= gpu.arena + gpu.arena_bytes;
}

static void arena_open(int on) {
    if (mprotect(gpu.arena, gpu.arena_bytes, on ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) abort();
}

static dt_status_t fake_copy(dt_device_t *dev, void *dst, const void *src, size_t bytes, dt_copy_kind_t kind) {
    (void)dev;
    static const int dst_dev[4] = {1, 0, 1, 0}, src_dev[4] = {0, 1, 1, 0};
    if ((unsigned)kind > DT_COPY_HOST_TO_HOST) return dt_error(DT_STATUS_INVALID, "fake gpu: copy kind %d", (int)kind);
    if (in_arena(dst, bytes) != dst_dev[kind] || in_arena(src, bytes) != src_dev[kind])
        return dt_error(DT_STATUS_INVALID, "fake gpu: copy kind %d of %zu bytes: dst %s device memory, src %s", (int)kind,
                        bytes, in_arena(dst, bytes) ? "in" : "not in", in_arena(src, bytes) ? "in" : "not in");
    pthread_mutex_lock(&gpu.mu);
    arena_open(1);
    memmove(dst, src, bytes);
    arena_open(0);
    gpu.calls[kind]++;
    gpu.bytes[kind] += bytes;
    pthread_mutex_unlock(&gpu.mu);
    return DT_STATUS_OK;
}

static dt_status_t fake_set(dt_device_t *dev, void *ptr, int byte, size_t bytes) {
    (void)dev;
    if (!in_arena(ptr, bytes)) return dt_error(DT_STATUS_INVALID, "fake gpu: set outside device memory");
    pthread_mutex_lock(&gpu.mu);
    arena_open(1);
    memset(ptr, byte, bytes);
    arena_open(0);
    pthread_mutex_unlock(&gpu.mu);
    return DT_STATUS_OK;
}

static void fake_gpu_open(size_t arena_bytes) {
    if (dt_device_init(&gpu.cpu, DT_DEVICE_CPU, 1) != DT_STATUS_OK) abort();
    gpu.ops = *gpu.cpu->ops;
    gpu.ops.name = "fake-cuda";
    gpu.ops.copy = fake_copy;
    gpu.ops.set = fake_set;
    gpu.dev = *gpu.cpu;
    gpu.dev.kind = DT_DEVICE_CUDA;
    gpu.dev.ops = &gpu.ops;
    gpu.arena_bytes = (arena_bytes + 4095) & ~(size_t)4095;
    gpu.arena = mmap(NULL, gpu.arena_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (gpu.arena == MAP_FAILED) abort();
}

/* Device memory (64-byte aligned) from the arena. */
static void *fake_gpu_alloc(size_t bytes) {
    size_t at = (gpu.used + 63) & ~(size_t)63;
    if (at + bytes > gpu.arena_bytes) abort();
    gpu.used = at + bytes;
    return gpu.arena + at;
}

/* The test's own transfers (not counted). */
static void fake_gpu_xfer(void *dst, const void *src, size_t bytes) {
    pthread_mutex_lock(&gpu.mu);
    arena_open(1);
    memmove(dst, src, bytes);
    arena_open(0);
    pthread_mutex_unlock(&gpu.mu);
}

/* Copies since the last call match (calls, bytes) device->host and host->device,
 * and nothing device->device; prints what differs. Resets the counts. */
static int fake_gpu_expect(const char *what, long d2h_calls, size_t d2h_bytes, long h2d_calls, size_t h2d_bytes) {
    int ok = gpu.calls[DT_COPY_DEVICE_TO_HOST] == d2h_calls && gpu.bytes[DT_COPY_DEVICE_TO_HOST] == d2h_bytes &&
             gpu.calls[DT_COPY_HOST_TO_DEVICE] == h2d_calls && gpu.bytes[DT_COPY_HOST_TO_DEVICE] == h2d_bytes &&
             gpu.calls[DT_COPY_DEVICE_TO_DEVICE] == 0 && gpu.calls[DT_COPY_HOST_TO_HOST] == 0;
    if (!ok)
        fprintf(stderr,
                "%s: staging copies d2h %ld calls/%zu bytes, h2d %ld/%zu, d2d %ld, h2h %ld; expected d2h %ld/%zu, "
                "h2d %ld/%zu, none other\n",
                what, gpu.calls[DT_COPY_DEVICE_TO_HOST], gpu.bytes[DT_COPY_DEVICE_TO_HOST],
                gpu.calls[DT_COPY_HOST_TO_DEVICE], gpu.bytes[DT_COPY_HOST_TO_DEVICE], gpu.calls[DT_COPY_DEVICE_TO_DEVICE],
                gpu.calls[DT_COPY_HOST_TO_HOST], d2h_calls, d2h_bytes, h2d_calls, h2d_bytes);
    memset(gpu.calls, 0, sizeof(gpu.calls));
    memset(gpu.bytes, 0, sizeof(gpu.bytes));
    return ok;
}

#define STAGED_ARENA_BYTES (64u << 20)

/* ---- rank processes -----------------------------------------------------------------
 * A rank is this binary again, fork()ed and exec()ed, not a bare fork() child:
 * the test process has threads (Criterion's message thread, the store
 * server's loop), and a lock one of them holds at the moment of fork() stays
 * locked forever in the child, which may call only async-signal-safe functions
 * until it execs. A bare fork child hung that way about once in 30 runs of a
 * 4-rank test (under ASan: rank 0's communication thread blocked at its start
 * on an allocator lock inherited from the parent, and dt_comm_free waiting to
 * join it). The exec'd rank finds its job in DT_TEST_COMM_RANK and runs it
 * from a constructor, before Criterion's main. */

extern char **environ;
static int rank_fn_index(rank_fn_t fn);
static rank_fn_t rank_fn_at(int i);

static int rank_main(const group_t *g, int rank, int port, rank_fn_t fn) {
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
    if (g->staged) {
        fake_gpu_open(STAGED_ARENA_BYTES);
        cfg.stage_dev = &gpu.dev;
    }
    dt_comm_t *comm = NULL;
    if (dt_comm_init(&cfg, &comm) != DT_STATUS_OK) {
        fprintf(stderr, "rank %d: dt_comm_init: %s\n", rank, dt_error_detail());
        return 90;
    }
    int rc = fn(comm, g, NULL);
    dt_comm_free(comm);
    return rc;
}

__attribute__((constructor)) static void rank_process(void) {
    const char *spec = getenv("DT_TEST_COMM_RANK");
    if (!spec) return;
    group_t g = {0};
    int fi = -1, rank = -1, port = 0, backend = 0;
    if (sscanf(spec, "%d %d %d %d %d %d %lf %63s %d %zu %lf %d", &fi, &rank, &port, &g.n, &g.lws, &backend,
               &g.timeout_s, g.run_id, &g.round, &g.chunk, &g.limit_s, &g.staged) != 12 ||
        !rank_fn_at(fi)) {
        fprintf(stderr, "test_comm rank: bad DT_TEST_COMM_RANK \"%s\"\n", spec);
        _exit(91);
    }
    g.backend = (dt_comm_backend_t)backend;
    _exit(rank_main(&g, rank, port, rank_fn_at(fi)));
}

static pid_t spawn_rank(const group_t *g, int rank, rank_fn_t fn, void *arg) {
    cr_assert(arg == NULL, "rank functions take no argument (ranks are exec'd)");
    cr_assert(rank_fn_index(fn) >= 0, "rank function missing from rank_fns[]");
    int port = store_port();
    /* everything the child needs is made before fork: after it, only execve */
    static char spec[512];
    snprintf(spec, sizeof(spec), "DT_TEST_COMM_RANK=%d %d %d %d %d %d %.17g %s %d %zu %.17g %d", rank_fn_index(fn),
             rank, port, g->n, g->lws, (int)g->backend, g->timeout_s, g->run_id, g->round, g->chunk, g->limit_s,
             g->staged);
    size_t ne = 0;
    while (environ[ne]) ne++;
    char **envp = calloc(ne + 2, sizeof(char *));
    size_t k = 0;
    for (size_t i = 0; i < ne; i++)
        if (strncmp(environ[i], "DT_TEST_COMM_RANK=", 18) != 0) envp[k++] = environ[i];
    envp[k++] = spec;
    envp[k] = NULL;
    static char exe[4096];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    cr_assert(el > 0, "readlink /proc/self/exe");
    exe[el] = 0;
    char *argv[] = {exe, NULL};
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        execve(exe, argv, envp);
        _exit(127);
    }
    free(envp);
    return pid;
}

/* Runs fn on n ranks; codes[i] = exit code (128+signal, 124 if over the limit). */
static void run_group(const group_t *g, rank_fn_t fn, void *arg, int *codes) {
    pid_t pids[16];
    for (int i = 0; i < g->n; i++) pids[i] = spawn_rank(g, i, fn, arg);
    /* Sanitizer builds run several times slower: the runner scales limits. */
    const char *scale_env = getenv("DTRUN_TEST_TIME_SCALE");
    double scale = scale_env && atof(scale_env) >= 1 ? atof(scale_env) : 1.0;
    double deadline = dt_now_s() + g->limit_s * scale;
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
    /* full 24-bit mantissas at exponents -8..0 and both signs: sums round, so
     * a different summation order shows */
    float f = ldexpf(1.0f + (float)((h >> 40) & 0x7fffff) / 8388608.0f, -(int)((h >> 20) % 9));
    if (h & 1) f = -f;
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
    float v[16] = {0};
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
        float s[16] = {0};
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

/* ---- failure messages -------------------------------------------------------------- */

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


#endif /* DT_TESTS_COMM_HARNESS_H */
