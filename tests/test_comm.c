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

/* Staged groups (g->staged): the op gets device buffers of the fake GPU (din,
 * dout) while inputs are made and results checked in host mirrors (in, out);
 * put/get move them (uncounted), and every op's staging copies are checked. */
static void put(const group_t *g, void *dev, const void *host, size_t bytes) {
    if (g->staged) fake_gpu_xfer(dev, host, bytes);
}
static void get(const group_t *g, void *host, const void *dev, size_t bytes) {
    if (g->staged) fake_gpu_xfer(host, dev, bytes);
}
/* One copy call of each nonzero size expected. */
static int staged_ok(const group_t *g, const char *what, size_t d2h, size_t h2d) {
    if (!g->staged) return 1;
    return fake_gpu_expect(what, d2h ? 1 : 0, d2h, h2d ? 1 : 0, h2d);
}

static int every_op(dt_comm_t *c, const group_t *g, void *arg) {
    int n = dt_comm_size(c), r = dt_comm_rank(c);
    dt_comm_backend_t b = dt_comm_backend(c);
    size_t maxc = counts[sizeof(counts) / sizeof(counts[0]) - 1];
    size_t cap = (maxc + 8) * 4 * (size_t)n;
    uint8_t *in = dt_mem_alloc(DT_MEM_OTHER, cap);
    uint8_t *out = dt_mem_alloc(DT_MEM_OTHER, cap);
    uint8_t *din = g->staged ? fake_gpu_alloc(cap) : in, *dout = g->staged ? fake_gpu_alloc(cap) : out;
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
                put(g, din, in, count * es);
                void *dst = op == DT_COMM_AVG ? in : out, *ddst = op == DT_COMM_AVG ? din : dout;
                if (dt_comm_all_reduce(c, din, ddst, count, dt, redop) != DT_STATUS_OK)
                    return call_failed(c, "all_reduce", count);
                if (!staged_ok(g, "all_reduce", count * es, count * es)) return 6;
                get(g, dst, ddst, count * es);
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
                put(g, din, in, count * es);
                size_t off = dt_comm_slice_offset(count, n, r), len = dt_comm_slice_count(count, n, r);
                void *dst = op ? (void *)(in + off * es) : (void *)out;
                void *ddst = op ? (void *)(din + off * es) : (void *)dout;
                if (dt_comm_reduce_scatter(c, din, ddst, count, dt, (dt_comm_redop_t)op) != DT_STATUS_OK)
                    return call_failed(c, "reduce_scatter", count);
                if (!staged_ok(g, "reduce_scatter", count * es, len * es)) return 6;
                get(g, dst, ddst, len * es);
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
                void *dsrc = inplace ? (void *)(dout + (size_t)r * count * es) : (void *)din;
                fill(src, r, count, salt, dt);
                put(g, dsrc, src, count * es);
                if (dt_comm_all_gather(c, dsrc, dout, count, dt) != DT_STATUS_OK)
                    return call_failed(c, "all_gather", count);
                if (!staged_ok(g, "all_gather", count * es, (size_t)n * count * es)) return 6;
                get(g, out, dout, (size_t)n * count * es);
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
            put(g, dout, out, count * es);
            if (dt_comm_broadcast(c, dout, count, dt, n - 1) != DT_STATUS_OK) return call_failed(c, "broadcast", count);
            if (!staged_ok(g, "broadcast", r == n - 1 ? count * es : 0, r == n - 1 ? 0 : count * es)) return 6;
            get(g, out, dout, count * es);
            for (size_t i = 0; i < count; i++) {
                uint32_t want = ref_bits(val(n - 1, i, salt, dt), dt);
                if (bits_at(out, i, dt) != want) return fail_msg(g, c, "broadcast", count, dt, i, bits_at(out, i, dt), want);
            }
            if (dt_comm_barrier(c) != DT_STATUS_OK) return call_failed(c, "barrier", 0);
            if (!staged_ok(g, "barrier", 0, 0)) return 6;
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

/* CUDA buffers through the CPU communicator (host staging), on a fake GPU. */
Test(comm_shm, every_op_staged_from_device_world_2_3) {
    group_t g = group(2, DT_COMM_BACKEND_SHM);
    g.staged = 1;
    expect_all_ok(&g, every_op, NULL);
    g = group(3, DT_COMM_BACKEND_SHM);
    g.round = 1;
    g.staged = 1;
    expect_all_ok(&g, every_op, NULL);
}

Test(comm_tcp, every_op_staged_from_device_world_2_3) {
    group_t g = group(2, DT_COMM_BACKEND_TCP);
    g.staged = 1;
    expect_all_ok(&g, every_op, NULL);
    g = group(3, DT_COMM_BACKEND_TCP);
    g.round = 1;
    g.staged = 1;
    expect_all_ok(&g, every_op, NULL);
}

Test(comm_hier, every_op_two_nodes_of_two) {
    group_t g = group(4, DT_COMM_BACKEND_HIER);
    g.lws = 2;
    expect_all_ok(&g, every_op, NULL);
}

/* ---- async requests interleaved with compute ------------------------------------- */

static int async_overlap(dt_comm_t *c, const group_t *g, void *arg) {
    int n = dt_comm_size(c), r = dt_comm_rank(c);
    enum { NB = 4, COUNT = 200003 };
    float *bufs[NB];
    dt_comm_req_t reqs[NB + 1];
    for (int k = 0; k < NB; k++) {
        bufs[k] = dt_mem_alloc(DT_MEM_COMM, COUNT * sizeof(float));
        fill(bufs[k], r, COUNT, 100 + (uint32_t)k, DT_COMM_F32);
        if (dt_comm_all_reduce_async(c, bufs[k], bufs[k], COUNT, DT_COMM_F32, DT_COMM_SUM, &reqs[k]) != DT_STATUS_OK)
            return call_failed(c, "all_reduce_async", COUNT);
    }
    float mine = (float)r, *all = dt_mem_alloc(DT_MEM_COMM, sizeof(float) * (size_t)n);
    if (dt_comm_all_gather_async(c, &mine, all, 1, DT_COMM_F32, &reqs[NB]) != DT_STATUS_OK)
        return call_failed(c, "all_gather_async", 1);
    /* compute while the communication thread works; requests must finish in order */
    double acc = 0;
    int done[NB + 1] = {0}, polls = 0;
    for (int it = 0; it < 200000 && !done[NB]; it++) {
        for (int j = 0; j < 2000; j++) acc += (double)j * 1e-9;
        for (int k = 0; k <= NB; k++) {
            int d = 0;
            dt_comm_test(&reqs[k], &d);
            if (d && !done[k]) {
                for (int e = 0; e < k; e++)
                    if (!done[e]) {
                        fprintf(stderr, "request %d completed before request %d\n", k, e);
                        return 3;
                    }
                done[k] = 1;
            }
        }
        polls++;
    }
    for (int k = 0; k <= NB; k++)
        if (dt_comm_wait(&reqs[k]) != DT_STATUS_OK) return call_failed(c, "wait", (size_t)k);
    if (polls < 2) {
        fprintf(stderr, "the ops completed before any compute ran (%d polls)\n", polls);
        return 4;
    }
    for (int k = 0; k < NB; k++)
        for (size_t i = 0; i < COUNT; i++) {
            uint32_t want = ref_bits(ref_sum(g, DT_COMM_BACKEND_SHM, COUNT, i, 100 + (uint32_t)k, DT_COMM_F32, DT_COMM_SUM),
                                     DT_COMM_F32);
            if (bits_at(bufs[k], i, DT_COMM_F32) != want)
                return fail_msg(g, c, "async all_reduce", COUNT, DT_COMM_F32, i, bits_at(bufs[k], i, DT_COMM_F32), want);
        }
    for (int k = 0; k < n; k++)
        if (all[k] != (float)k) return fail_msg(g, c, "async all_gather", 1, DT_COMM_F32, (size_t)k, 0, 0);
    /* a blocking op after async ones queues behind them and still works */
    float one = 1, sum = 0;
    if (dt_comm_all_reduce(c, &one, &sum, 1, DT_COMM_F32, DT_COMM_SUM) != DT_STATUS_OK || sum != (float)n)
        return call_failed(c, "all_reduce after async", 1);
    for (int k = 0; k < NB; k++) dt_mem_free(bufs[k]);
    dt_mem_free(all);
    return acc > 0 ? 0 : 5;
}

/* Staged async requests: when a request reports done its result is already on
 * the device (the host->device copy is part of the op), in issue order. */
static int staged_async(dt_comm_t *c, const group_t *g, void *arg) {
    int r = dt_comm_rank(c);
    enum { NB = 3, COUNT = 100003 };
    float *host = dt_mem_alloc(DT_MEM_OTHER, COUNT * sizeof(float));
    float *dev[NB];
    dt_comm_req_t reqs[NB];
    for (int k = 0; k < NB; k++) {
        dev[k] = fake_gpu_alloc(COUNT * sizeof(float));
        fill(host, r, COUNT, 200 + (uint32_t)k, DT_COMM_F32);
        fake_gpu_xfer(dev[k], host, COUNT * sizeof(float));
        if (dt_comm_all_reduce_async(c, dev[k], dev[k], COUNT, DT_COMM_F32, DT_COMM_AVG, &reqs[k]) != DT_STATUS_OK)
            return call_failed(c, "all_reduce_async", COUNT);
    }
    int next = 0;
    for (int it = 0; it < 2000000 && next < NB; it++) {
        int d[NB] = {0};
        for (int k = 0; k < NB; k++) dt_comm_test(&reqs[k], &d[k]);
        for (int k = next + 1; k < NB; k++)
            if (d[k] && !d[next]) {
                fprintf(stderr, "request %d completed before request %d\n", k, next);
                return 3;
            }
        if (!d[next]) {
            dt_sleep_ms(0);
            continue;
        }
        if (dt_comm_wait(&reqs[next]) != DT_STATUS_OK) return call_failed(c, "wait", (size_t)next);
        fake_gpu_xfer(host, dev[next], COUNT * sizeof(float)); /* read right at completion */
        for (size_t i = 0; i < COUNT; i++) {
            uint32_t want = ref_bits(ref_sum(g, dt_comm_backend(c), COUNT, i, 200 + (uint32_t)next, DT_COMM_F32, DT_COMM_AVG),
                                     DT_COMM_F32);
            if (bits_at(host, i, DT_COMM_F32) != want)
                return fail_msg(g, c, "staged async all_reduce", COUNT, DT_COMM_F32, i, bits_at(host, i, DT_COMM_F32), want);
        }
        next++;
    }
    if (next < NB) return call_failed(c, "requests did not complete", COUNT);
    if (!fake_gpu_expect("staged async", NB, NB * COUNT * sizeof(float), NB, NB * COUNT * sizeof(float))) return 6;
    dt_mem_free(host);
    return 0;
}

/* One rank: no backend runs; an out-of-place op is one device->device copy. */
Test(comm, staged_world_1_copies_on_the_device) {
    fake_gpu_open(1 << 20);
    dt_comm_config_t cfg = {0};
    cfg.store_host = "127.0.0.1";
    cfg.store_port = store_port();
    cfg.run_id = "staged1";
    cfg.world_size = 1;
    cfg.backend = DT_COMM_BACKEND_SHM;
    cfg.device = -1;
    cfg.stage_dev = &gpu.dev;
    dt_comm_t *c = NULL;
    cr_assert_eq(dt_comm_init(&cfg, &c), DT_STATUS_OK, "%s", dt_error_detail());
    float host[100], back[100];
    for (int i = 0; i < 100; i++) host[i] = (float)i * 0.5f;
    float *a = fake_gpu_alloc(sizeof(host)), *b = fake_gpu_alloc(sizeof(host));
    fake_gpu_xfer(a, host, sizeof(host));
    cr_assert_eq(dt_comm_all_reduce(c, a, b, 100, DT_COMM_F32, DT_COMM_SUM), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(gpu.calls[DT_COPY_DEVICE_TO_DEVICE], 1);
    cr_assert_eq(gpu.bytes[DT_COPY_DEVICE_TO_DEVICE], sizeof(host));
    fake_gpu_xfer(back, b, sizeof(back));
    cr_assert_eq(memcmp(back, host, sizeof(host)), 0);
    gpu.calls[DT_COPY_DEVICE_TO_DEVICE] = 0;
    gpu.bytes[DT_COPY_DEVICE_TO_DEVICE] = 0;
    cr_assert_eq(dt_comm_all_gather(c, a, a, 100, DT_COMM_F32), DT_STATUS_OK); /* in place: nothing to move */
    cr_assert(fake_gpu_expect("world 1 in place", 0, 0, 0, 0));
    dt_comm_free(c);
}

Test(comm_tcp, staged_async_requests_complete_in_order_with_results_on_device) {
    group_t g = group(2, DT_COMM_BACKEND_TCP);
    g.staged = 1;
    expect_all_ok(&g, staged_async, NULL);
}

Test(comm_shm, async_requests_overlap_compute_and_complete_in_order) {
    group_t g = group(2, DT_COMM_BACKEND_SHM);
    g.chunk = 32 * 1024;
    expect_all_ok(&g, async_overlap, NULL);
}

/* ---- sub-communicators ----------------------------------------------------------------- */

static int split_groups(dt_comm_t *c, const group_t *g, void *arg) {
    int r = dt_comm_rank(c);
    /* even and odd ranks, ordered by descending parent rank; rank 3 joins none in a second split */
    dt_comm_t *sub = NULL;
    if (dt_comm_split(c, r % 2, -r, &sub) != DT_STATUS_OK) return call_failed(c, "split", 0);
    if (dt_comm_size(sub) != 2) return 10;
    int want_rank = r >= 2 ? 0 : 1;
    if (dt_comm_rank(sub) != want_rank) {
        fprintf(stderr, "rank %d: sub rank %d, expected %d\n", r, dt_comm_rank(sub), want_rank);
        return 11;
    }
    float x = (float)(r + 1), y = 0;
    if (dt_comm_all_reduce(sub, &x, &y, 1, DT_COMM_F32, DT_COMM_SUM) != DT_STATUS_OK) return call_failed(sub, "sub all_reduce", 1);
    float want = r % 2 ? 2.0f + 4.0f : 1.0f + 3.0f;
    if (y != want) {
        fprintf(stderr, "rank %d: sub all_reduce %g, expected %g\n", r, y, want);
        return 12;
    }
    float gathered[2];
    if (dt_comm_all_gather(sub, &x, gathered, 1, DT_COMM_F32) != DT_STATUS_OK) return call_failed(sub, "sub all_gather", 1);
    /* sub rank 0 is the higher parent rank */
    if (gathered[0] != (float)((r % 2) + 2 + 1) || gathered[1] != (float)((r % 2) + 1)) return 13;
    /* the parent still works between sub-communicator ops */
    float s = 1, t = 0;
    if (dt_comm_all_reduce(c, &s, &t, 1, DT_COMM_F32, DT_COMM_SUM) != DT_STATUS_OK || t != 4.0f) return 14;
    dt_comm_t *sub2 = NULL;
    if (dt_comm_split(c, r == 3 ? -1 : 0, 0, &sub2) != DT_STATUS_OK) return call_failed(c, "split 2", 0);
    if (r == 3) {
        if (sub2) return 15;
    } else {
        if (!sub2 || dt_comm_size(sub2) != 3) return 16;
        if (dt_comm_barrier(sub2) != DT_STATUS_OK) return call_failed(sub2, "barrier", 0);
    }
    dt_comm_free(sub2);
    dt_comm_free(sub);
    return 0;
}

Test(comm_shm, split_into_groups) {
    group_t g = group(4, DT_COMM_BACKEND_SHM);
    expect_all_ok(&g, split_groups, NULL);
}

Test(comm_hier, split_across_nodes_uses_tcp) {
    group_t g = group(4, DT_COMM_BACKEND_HIER);
    g.lws = 2;
    expect_all_ok(&g, split_groups, NULL);
}

/* ---- hangs and mismatches ---------------------------------------------------------------- */

static int mismatched(dt_comm_t *c, const group_t *g, void *arg) {
    int r = dt_comm_rank(c);
    float in[1000] = {0}, out[2000];
    float one = 1, sum;
    /* one good op first so the mismatch is at #2 */
    if (dt_comm_all_reduce(c, &one, &sum, 1, DT_COMM_F32, DT_COMM_SUM) != DT_STATUS_OK) return 20;
    dt_status_t st = r == 1 ? dt_comm_all_gather(c, in, out, 500, DT_COMM_F32)
                            : dt_comm_all_reduce(c, in, out, 1000, DT_COMM_F32, DT_COMM_SUM);
    const char *d = dt_error_detail();
    fprintf(stderr, "rank %d: %s: %s\n", r, dt_status_name(st), d);
    if (st == DT_STATUS_OK) return 21;
    if (g->backend == DT_COMM_BACKEND_SHM && st != DT_STATUS_TIMEOUT) return 22;
    int names_both = strstr(d, "all_reduce #2 (count 1000, f32, sum)") && strstr(d, "all_gather #2 (count 500, f32)");
    if (!names_both && g->backend == DT_COMM_BACKEND_SHM) return 23;
    /* tcp: the rank that sees the other's header names both; others may see the peer leave */
    if (!names_both && st != DT_STATUS_CLOSED && st != DT_STATUS_MISMATCH) return 24;
    /* the communicator is broken now: the next op fails at once, naming the cause */
    double t0 = dt_now_s();
    if (dt_comm_barrier(c) == DT_STATUS_OK || dt_now_s() - t0 > 1.0) return 25;
    if (!strstr(dt_error_detail(), "failed earlier")) return 26;
    return names_both ? 0 : 30;
}

Test(comm_shm, mismatched_ops_time_out_naming_both_ops) {
    group_t g = group(3, DT_COMM_BACKEND_SHM);
    g.timeout_s = 2.0;
    double t0 = dt_now_s();
    int codes[3];
    run_group(&g, mismatched, NULL, codes);
    for (int i = 0; i < 3; i++) cr_expect_eq(codes[i], 0, "rank %d exited %d", i, codes[i]);
    cr_expect(dt_now_s() - t0 < 10.0, "took %.1f s", dt_now_s() - t0);
}

Test(comm_tcp, mismatched_ops_fail_naming_both_ops) {
    group_t g = group(2, DT_COMM_BACKEND_TCP);
    g.timeout_s = 3.0;
    int codes[2];
    run_group(&g, mismatched, NULL, codes);
    /* both ranks receive the other's op header */
    for (int i = 0; i < 2; i++) cr_expect_eq(codes[i], 0, "rank %d exited %d", i, codes[i]);
}

/* ---- stale segments of a killed run -------------------------------------------------------- */

static int count_segments(const char *run_id) {
    char pre[128];
    int plen = snprintf(pre, sizeof(pre), "dtrun.%s.", run_id), k = 0;
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, pre, (size_t)plen)) k++;
    if (d) closedir(d);
    return k;
}

static int hang_in_init_never(dt_comm_t *c, const group_t *g, void *arg) { return 0; }

static int one_all_reduce(dt_comm_t *c, const group_t *g, void *arg) {
    float x = 1, y = 0;
    if (dt_comm_all_reduce(c, &x, &y, 1, DT_COMM_F32, DT_COMM_SUM) != DT_STATUS_OK) return 1;
    return y == (float)dt_comm_size(c) ? 0 : 2;
}

static int all_reduce_forever(dt_comm_t *c, const group_t *g, void *arg) {
    static float buf[1 << 18];
    for (;;)
        if (dt_comm_all_reduce(c, buf, buf, 1 << 18, DT_COMM_F32, DT_COMM_SUM) != DT_STATUS_OK) return 1;
}

Test(comm_shm, stale_segments_of_a_killed_round_are_removed) {
    group_t g = group(2, DT_COMM_BACKEND_SHM);
    g.timeout_s = 20;
    /* round 0: only rank 0 starts, creates its segment and waits for rank 1; SIGKILL it */
    pid_t p = spawn_rank(&g, 0, hang_in_init_never, NULL);
    double deadline = dt_now_s() + 10;
    while (count_segments(g.run_id) == 0 && dt_now_s() < deadline) dt_sleep_ms(5);
    cr_assert_eq(count_segments(g.run_id), 1, "rank 0 did not create its segment");
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    cr_assert_eq(count_segments(g.run_id), 1, "the killed rank's segment should still be there");

    /* round 1: both ranks run all_reduce; one is SIGKILLed mid-op */
    g.round = 1;
    pid_t a = spawn_rank(&g, 0, all_reduce_forever, NULL), b = spawn_rank(&g, 1, all_reduce_forever, NULL);
    deadline = dt_now_s() + 20;
    while (count_segments(g.run_id) != 0 && dt_now_s() < deadline) dt_sleep_ms(5);
    cr_expect_eq(count_segments(g.run_id), 0, "round 1 did not remove round 0's segment or unlink its own");
    dt_sleep_ms(100); /* both are in all_reduce now */
    kill(b, SIGKILL);
    waitpid(b, NULL, 0);
    kill(a, SIGKILL);
    waitpid(a, NULL, 0);
    cr_assert_eq(count_segments(g.run_id), 0, "a rank killed mid-op left a segment behind");

    /* round 2 starts cleanly and leaves nothing behind */
    g.round = 2;
    expect_all_ok(&g, one_all_reduce, NULL);
    cr_assert_eq(count_segments(g.run_id), 0);
}

/* ---- configuration and helpers -------------------------------------------------------------- */

Test(comm, config_from_env_names_what_is_wrong) {
    dt_comm_config_t cfg;
    unsetenv("MASTER_ADDR");
    cr_assert_eq(dt_comm_config_from_env(&cfg), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "MASTER_ADDR"));
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("RANK", "4", 1);
    cr_assert_eq(dt_comm_config_from_env(&cfg), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "RANK=\"4\""), "%s", dt_error_detail());
    setenv("RANK", "3", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("TORCHELASTIC_RUN_ID", "job/7", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
    cr_assert_eq(dt_comm_config_from_env(&cfg), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(cfg.rank, 3);
    cr_assert_eq(cfg.local_world_size, 2);
    cr_assert_eq(cfg.restart_round, 2);
    cr_assert_str_eq(cfg.run_id, "job/7");
    setenv("DTRUN_COMM", "carrier-pigeon", 1);
    cfg.store_port = store_port();
    cfg.world_size = 1;
    cfg.rank = 0;
    cfg.local_world_size = 1;
    dt_comm_t *c = NULL;
    cr_assert_eq(dt_comm_init(&cfg, &c), DT_STATUS_CONFIG);
    cr_assert(strstr(dt_error_detail(), "DTRUN_COMM=\"carrier-pigeon\""), "%s", dt_error_detail());
    unsetenv("DTRUN_COMM");
}

Test(comm, bad_arguments_are_errors_not_crashes) {
    group_t g = group(1, DT_COMM_BACKEND_SHM);
    dt_comm_config_t cfg = {.store_host = "127.0.0.1", .store_port = store_port(), .run_id = g.run_id,
                            .world_size = 1, .local_world_size = 1, .backend = DT_COMM_BACKEND_SHM, .device = -1};
    dt_comm_t *c = NULL;
    cr_assert_eq(dt_comm_init(&cfg, &c), DT_STATUS_OK, "%s", dt_error_detail());
    float x = 1;
    cr_assert_eq(dt_comm_broadcast(c, &x, 1, DT_COMM_F32, 1), DT_STATUS_INVALID);
    cr_assert(strstr(dt_error_detail(), "root 1"), "%s", dt_error_detail());
    cr_assert_eq(dt_comm_all_reduce(c, NULL, &x, 1, DT_COMM_F32, DT_COMM_SUM), DT_STATUS_INVALID);
    cr_assert_eq(dt_comm_all_reduce(c, &x, &x, 1, (dt_comm_dtype_t)7, DT_COMM_SUM), DT_STATUS_INVALID);
    cr_assert_eq(dt_comm_reduce_scatter(c, &x, &x, 1, DT_COMM_F32, DT_COMM_MAX), DT_STATUS_UNSUPPORTED);
    /* still usable: bad arguments do not consume a sequence number */
    cr_assert_eq(dt_comm_next_seq(c), 1);
    cr_assert_eq(dt_comm_all_reduce(c, &x, &x, 1, DT_COMM_F32, DT_COMM_AVG), DT_STATUS_OK);
    cr_assert_eq(x, 1.0f);
    dt_comm_free(c);
    cfg.rank = 2;
    cr_assert_eq(dt_comm_init(&cfg, &c), DT_STATUS_CONFIG);
}

Test(comm, bf16_rounds_to_nearest_even_and_slices) {
    cr_assert_eq(dt_comm_f32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0) */
    cr_assert_eq(dt_comm_f32_to_bf16(1.00390625f), 0x3f80);
    /* 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even) */
    cr_assert_eq(dt_comm_f32_to_bf16(1.01171875f), 0x3f82);
    cr_assert_eq(dt_comm_f32_to_bf16(1.0f + 0.005f), 0x3f81);
    cr_assert(isnan(dt_comm_bf16_to_f32(dt_comm_f32_to_bf16(NAN))));
    cr_assert_eq(dt_comm_bf16_to_f32(0xc000), -2.0f);
    /* 10 over 4 ranks: 3 3 2 2 */
    size_t want_n[4] = {3, 3, 2, 2}, want_o[4] = {0, 3, 6, 8};
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(dt_comm_slice_count(10, 4, r), want_n[r]);
        cr_assert_eq(dt_comm_slice_offset(10, 4, r), want_o[r]);
    }
    cr_assert_eq(dt_comm_slice_count(2, 4, 3), 0);
    cr_assert_eq(dt_comm_slice_offset(2, 4, 3), 2);
}

/* ---- a rank that dies: the others fail fast, naming the op ---------------------------------- */

static int die_or_reduce(dt_comm_t *c, const group_t *g, void *arg) {
    if (dt_comm_rank(c) == 1) _exit(0); /* gone without a word */
    float x[4096] = {0};
    double t0 = dt_now_s();
    dt_status_t st = dt_comm_all_reduce(c, x, x, 4096, DT_COMM_F32, DT_COMM_SUM);
    fprintf(stderr, "rank %d: %s: %s\n", dt_comm_rank(c), dt_status_name(st), dt_error_detail());
    if (st != DT_STATUS_CLOSED) return 1;
    if (!strstr(dt_error_detail(), "all_reduce #1 (count 4096, f32, sum)")) return 2;
    return dt_now_s() - t0 < 5.0 ? 0 : 3;
}

Test(comm_shm, a_dead_peer_fails_the_op_fast) {
    group_t g = group(2, DT_COMM_BACKEND_SHM);
    g.timeout_s = 60;
    int codes[2];
    run_group(&g, die_or_reduce, NULL, codes);
    cr_assert_eq(codes[0], 0, "rank 0 exited %d", codes[0]);
}

Test(comm_tcp, a_dead_peer_fails_the_op_fast) {
    group_t g = group(2, DT_COMM_BACKEND_TCP);
    g.timeout_s = 60;
    int codes[2];
    run_group(&g, die_or_reduce, NULL, codes);
    cr_assert_eq(codes[0], 0, "rank 0 exited %d", codes[0]);
}

/* ---- large messages (streaming output stores from 4 MiB) ----------------------------------- */

static int large_ops(dt_comm_t *c, const group_t *g, void *arg) {
    int n = dt_comm_size(c), r = dt_comm_rank(c);
    size_t count = 1048583; /* 4 MiB + 28 bytes, prime */
    float *in = dt_mem_alloc(DT_MEM_OTHER, count * 4), *out = dt_mem_alloc(DT_MEM_OTHER, (count + 1) * 4);
    for (int v = 0; v < 4; v++) {
        dt_comm_redop_t op = v == 1 ? DT_COMM_AVG : DT_COMM_SUM;
        uint32_t salt = 900 + (uint32_t)v;
        fill(in, r, count, salt, DT_COMM_F32);
        float *dst = v == 2 ? in : out + (v == 3); /* in place; and a misaligned output */
        if (dt_comm_all_reduce(c, in, dst, count, DT_COMM_F32, op) != DT_STATUS_OK)
            return call_failed(c, "large all_reduce", count);
        for (size_t i = 0; i < count; i++) {
            uint32_t want = ref_bits(ref_sum(g, DT_COMM_BACKEND_SHM, count, i, salt, DT_COMM_F32, op), DT_COMM_F32);
            if (bits_at(dst, i, DT_COMM_F32) != want)
                return fail_msg(g, c, "large all_reduce", count, DT_COMM_F32, i, bits_at(dst, i, DT_COMM_F32), want);
        }
    }
    fill(in, r, count, 950, DT_COMM_F32);
    if (dt_comm_reduce_scatter(c, in, out, count, DT_COMM_F32, DT_COMM_SUM) != DT_STATUS_OK)
        return call_failed(c, "large reduce_scatter", count);
    size_t off = dt_comm_slice_offset(count, n, r);
    for (size_t i = 0; i < dt_comm_slice_count(count, n, r); i++) {
        uint32_t want =
            ref_bits(ref_sum(g, DT_COMM_BACKEND_SHM, count, off + i, 950, DT_COMM_F32, DT_COMM_SUM), DT_COMM_F32);
        if (bits_at(out, i, DT_COMM_F32) != want)
            return fail_msg(g, c, "large reduce_scatter", count, DT_COMM_F32, off + i, bits_at(out, i, DT_COMM_F32), want);
    }
    dt_mem_free(in);
    dt_mem_free(out);
    return 0;
}

Test(comm_shm, large_messages_world_2_and_3) {
    group_t g = group(2, DT_COMM_BACKEND_SHM);
    expect_all_ok(&g, large_ops, NULL);
    g = group(3, DT_COMM_BACKEND_SHM);
    g.round = 1;
    expect_all_ok(&g, large_ops, NULL);
}

/* ---- the rank functions an exec'd rank can run (spawn_rank) --------------------------- */

static const rank_fn_t rank_fns[] = {
    every_op, async_overlap, staged_async, split_groups, mismatched, hang_in_init_never,
    one_all_reduce, all_reduce_forever, die_or_reduce, large_ops,
};

static int rank_fn_index(rank_fn_t fn) {
    for (int i = 0; i < (int)(sizeof(rank_fns) / sizeof(rank_fns[0])); i++)
        if (rank_fns[i] == fn) return i;
    return -1;
}

static rank_fn_t rank_fn_at(int i) {
    return i >= 0 && i < (int)(sizeof(rank_fns) / sizeof(rank_fns[0])) ? rank_fns[i] : NULL;
}
