/*
 * test_comm.c - the communicator with real processes: every test starts a store
 * on 127.0.0.1 (port 0) and forks one process per rank, each creating its
 * communicator through the store as a worker would (tests/comm_harness.h).
 * Here: every op on every backend, staged from device memory, async requests,
 * sub-communicators. Faults, hangs and bad input are test_comm_faults.c.
 *
 * Results are compared bitwise against a serial reference that sums in the
 * backend's documented order (shm: rank order; tcp: ring order; hier: node then
 * ring), so the checks also pin determinism.
 */
#define _GNU_SOURCE
#include "tests/comm_harness.h"

/* ---- every op against the reference ---------------------------------------------- */

static const size_t counts[] = {0, 1, 7, 13, 1009, 4099, 65537, 524291};

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

/* ---- the rank functions an exec'd rank can run (spawn_rank) --------------------------- */

static const rank_fn_t rank_fns[] = {
    every_op, async_overlap, staged_async, split_groups,
};

static int rank_fn_index(rank_fn_t fn) {
    for (int i = 0; i < (int)(sizeof(rank_fns) / sizeof(rank_fns[0])); i++)
        if (rank_fns[i] == fn) return i;
    return -1;
}

static rank_fn_t rank_fn_at(int i) {
    return i >= 0 && i < (int)(sizeof(rank_fns) / sizeof(rank_fns[0])) ? rank_fns[i] : NULL;
}
