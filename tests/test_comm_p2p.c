/*
 * test_comm_p2p.c - point to point (comm.h, comm_p2p.c) on real rank processes:
 * every backend (shm, tcp, hier, host staging of device buffers), odd sizes,
 * f32 and bf16, bitwise equality with what the sender holds; both directions
 * and every pair at once with async ops; many messages in flight on one
 * channel; a ring and the 1F1B pipeline order without deadlock; count and
 * dtype mismatches, a peer that stops sending and one that never comes (the
 * timeout names op, peer and sequence number), bad peers.
 */
#include "tests/comm_harness.h"

static const size_t sizes[] = {0, 1, 7, 1000003};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
static const dt_comm_dtype_t dtypes[] = {DT_COMM_F32, DT_COMM_BF16};

/* What sender s puts in message (k) to receiver d: distinct per pair and message. */
static uint32_t salt_of(int s, int d, int k) { return (uint32_t)(s * 131 + d * 17 + k * 7 + 1); }

/* Buffers: host memory, or the fake GPU's for staged groups. */
static void *buf_alloc(const group_t *g, size_t bytes) {
    return g->staged ? fake_gpu_alloc(bytes ? bytes : 1) : malloc(bytes ? bytes : 1);
}
static void buf_free(const group_t *g, void *p) {
    if (!g->staged) free(p);
}

static int check_msg(dt_comm_t *c, const group_t *g, const void *got_dev, int src, size_t count, dt_comm_dtype_t dt,
                     uint32_t salt, const char *what) {
    size_t bytes = count * dt_comm_dtype_size(dt);
    uint8_t *got = malloc(bytes + 1), *want = malloc(bytes + 1);
    if (g->staged)
        fake_gpu_xfer(got, got_dev, bytes);
    else
        memcpy(got, got_dev, bytes);
    fill(want, src, count, salt, dt);
    int rc = 0;
    for (size_t i = 0; i < count && !rc; i++)
        if (bits_at(got, i, dt) != bits_at(want, i, dt))
            rc = fail_msg(g, c, what, count, dt, i, bits_at(got, i, dt), bits_at(want, i, dt));
    free(got);
    free(want);
    return rc;
}

/* Every rank sends every size and dtype to every other rank and receives the
 * same from each, all async and in flight at once; odd ranks issue their
 * receives first. */
static int all_pairs(dt_comm_t *c, const group_t *g, void *arg) {
    (void)arg;
    int n = g->n, r = dt_comm_rank(c);
    int nmsg = (n - 1) * (int)NSIZES * 2;
    dt_comm_req_t *sreq = calloc((size_t)nmsg, sizeof(*sreq)), *rreq = calloc((size_t)nmsg, sizeof(*rreq));
    void **sbuf = calloc((size_t)nmsg, sizeof(void *)), **rbuf = calloc((size_t)nmsg, sizeof(void *));
    for (int pass = 0; pass < 2; pass++) {
        int recv_pass = (r % 2 == 1) ? pass == 0 : pass == 1;
        int m = 0;
        for (int p = 0; p < n; p++) {
            if (p == r) continue;
            for (size_t si = 0; si < NSIZES; si++)
                for (int di = 0; di < 2; di++, m++) {
                    size_t count = sizes[si], bytes = count * dt_comm_dtype_size(dtypes[di]);
                    int k = (int)si * 2 + di;
                    if (recv_pass) {
                        rbuf[m] = buf_alloc(g, bytes);
                        if (dt_comm_recv_async(c, rbuf[m], count, dtypes[di], p, &rreq[m]) != DT_STATUS_OK)
                            return call_failed(c, "recv_async", count);
                    } else {
                        void *h = malloc(bytes + 1);
                        fill(h, r, count, salt_of(r, p, k), dtypes[di]);
                        sbuf[m] = buf_alloc(g, bytes);
                        if (g->staged)
                            fake_gpu_xfer(sbuf[m], h, bytes);
                        else
                            memcpy(sbuf[m], h, bytes);
                        free(h);
                        if (dt_comm_send_async(c, sbuf[m], count, dtypes[di], p, &sreq[m]) != DT_STATUS_OK)
                            return call_failed(c, "send_async", count);
                    }
                }
        }
    }
    int m = 0, rc = 0;
    for (int p = 0; p < n; p++) {
        if (p == r) continue;
        for (size_t si = 0; si < NSIZES; si++)
            for (int di = 0; di < 2; di++, m++) {
                if (dt_comm_wait(&sreq[m]) != DT_STATUS_OK) return call_failed(c, "send wait", sizes[si]);
                if (dt_comm_wait(&rreq[m]) != DT_STATUS_OK) return call_failed(c, "recv wait", sizes[si]);
                if (!rc)
                    rc = check_msg(c, g, rbuf[m], p, sizes[si], dtypes[di], salt_of(p, r, (int)si * 2 + di), "recv");
                buf_free(g, sbuf[m]);
                buf_free(g, rbuf[m]);
            }
    }
    free(sreq);
    free(rreq);
    free(sbuf);
    free(rbuf);
    return rc;
}

Test(comm_p2p, shm_all_pairs_odd_sizes_bitwise_world_3) {
    group_t g = group(3, DT_COMM_BACKEND_SHM);
    expect_all_ok(&g, all_pairs, NULL);
}

Test(comm_p2p, tcp_all_pairs_odd_sizes_bitwise_world_3) {
    group_t g = group(3, DT_COMM_BACKEND_TCP);
    expect_all_ok(&g, all_pairs, NULL);
}

Test(comm_p2p, hier_all_pairs_two_nodes_of_two) {
    group_t g = group(4, DT_COMM_BACKEND_HIER);
    g.lws = 2;
    g.limit_s = 120.0;
    expect_all_ok(&g, all_pairs, NULL);
}

Test(comm_p2p, shm_staged_from_device_world_2) {
    group_t g = group(2, DT_COMM_BACKEND_SHM);
    g.staged = 1;
    expect_all_ok(&g, all_pairs, NULL);
}

Test(comm_p2p, tcp_staged_from_device_world_2) {
    group_t g = group(2, DT_COMM_BACKEND_TCP);
    g.staged = 1;
    expect_all_ok(&g, all_pairs, NULL);
}

/* 64 messages of different sizes in flight on channel 0 -> 1: they arrive in
 * issue order. A small slot size makes the large ones take many rounds. */
#define NFLIGHT 64
static int many_in_flight(dt_comm_t *c, const group_t *g, void *arg) {
    (void)arg;
    int r = dt_comm_rank(c);
    dt_comm_req_t req[NFLIGHT];
    float *buf[NFLIGHT];
    for (int k = 0; k < NFLIGHT; k++) {
        size_t count = (size_t)k * 997 + 3;
        buf[k] = malloc(count * sizeof(float));
        if (r == 0) fill(buf[k], 0, count, salt_of(0, 1, k), DT_COMM_F32);
        dt_status_t st = r == 0 ? dt_comm_send_async(c, buf[k], count, DT_COMM_F32, 1, &req[k])
                                : dt_comm_recv_async(c, buf[k], count, DT_COMM_F32, 0, &req[k]);
        if (st != DT_STATUS_OK) return call_failed(c, "async", count);
    }
    int rc = 0;
    for (int k = NFLIGHT - 1; k >= 0; k--) /* waiting out of order is fine */
        if (dt_comm_wait(&req[k]) != DT_STATUS_OK) return call_failed(c, "wait", (size_t)k);
    for (int k = 0; k < NFLIGHT && r == 1 && !rc; k++)
        rc = check_msg(c, g, buf[k], 0, (size_t)k * 997 + 3, DT_COMM_F32, salt_of(0, 1, k), "in flight");
    for (int k = 0; k < NFLIGHT; k++) free(buf[k]);
    return rc;
}

Test(comm_p2p, shm_many_messages_in_flight_keep_order) {
    group_t g = group(2, DT_COMM_BACKEND_SHM);
    g.chunk = 4096;
    expect_all_ok(&g, many_in_flight, NULL);
}

Test(comm_p2p, tcp_many_messages_in_flight_keep_order) {
    group_t g = group(2, DT_COMM_BACKEND_TCP);
    expect_all_ok(&g, many_in_flight, NULL);
}

/* Each rank sends to r+1 and receives from r-1 at once, several times. */
static int ring(dt_comm_t *c, const group_t *g, void *arg) {
    (void)arg;
    int n = g->n, r = dt_comm_rank(c), next = (r + 1) % n, prev = (r + n - 1) % n;
    size_t count = 100003;
    float *s = malloc(count * sizeof(float)), *d = malloc(count * sizeof(float));
    int rc = 0;
    for (int k = 0; k < 5 && !rc; k++) {
        fill(s, r, count, salt_of(r, next, k), DT_COMM_F32);
        dt_comm_req_t sr;
        if (dt_comm_send_async(c, s, count, DT_COMM_F32, next, &sr) != DT_STATUS_OK) return call_failed(c, "send", count);
        if (dt_comm_recv(c, d, count, DT_COMM_F32, prev) != DT_STATUS_OK) return call_failed(c, "recv", count);
        if (dt_comm_wait(&sr) != DT_STATUS_OK) return call_failed(c, "send wait", count);
        rc = check_msg(c, g, d, prev, count, DT_COMM_F32, salt_of(prev, r, k), "ring");
    }
    free(s);
    free(d);
    return rc;
}

Test(comm_p2p, shm_ring_world_4) {
    group_t g = group(4, DT_COMM_BACKEND_SHM);
    expect_all_ok(&g, ring, NULL);
}

Test(comm_p2p, tcp_ring_world_3) {
    group_t g = group(3, DT_COMM_BACKEND_TCP);
    expect_all_ok(&g, ring, NULL);
}

/* The 1F1B order of a pipeline of n stages and M micro-batches: stage s runs
 * n-s-1 warm-up forwards, then one forward and one backward at a time, then
 * the remaining backwards. A forward receives the activation from s-1 (blocking)
 * and sends its own to s+1 (async); a backward receives the gradient from s+1
 * and sends its own to s-1 (async). Every payload is checked. */
#define PIPE_M 8
static int pipeline_1f1b(dt_comm_t *c, const group_t *g, void *arg) {
    (void)arg;
    int n = g->n, s = dt_comm_rank(c);
    size_t count = 4099;
    dt_comm_req_t sreq[2 * PIPE_M];
    float *sbuf[2 * PIPE_M], *in = malloc(count * sizeof(float));
    int nsend = 0, fwd = 0, bwd = 0, rc = 0;
    int warm = n - s - 1 < PIPE_M ? n - s - 1 : PIPE_M;
    int order[2 * PIPE_M], no = 0; /* 0 forward, 1 backward */
    for (int i = 0; i < warm; i++) order[no++] = 0;
    for (int i = 0; i < PIPE_M - warm; i++) order[no++] = 0, order[no++] = 1;
    for (int i = 0; i < warm; i++) order[no++] = 1;
    for (int o = 0; o < no && !rc; o++) {
        int is_bwd = order[o], mb = is_bwd ? bwd++ : fwd++;
        int from = is_bwd ? s + 1 : s - 1, to = is_bwd ? s - 1 : s + 1;
        uint32_t tag = (uint32_t)(is_bwd * 1000 + mb);
        if (from >= 0 && from < n) {
            if (dt_comm_recv(c, in, count, DT_COMM_F32, from) != DT_STATUS_OK) return call_failed(c, "pipe recv", count);
            rc = check_msg(c, g, in, from, count, DT_COMM_F32, salt_of(from, s, (int)tag), is_bwd ? "grad" : "act");
        }
        if (to >= 0 && to < n) {
            sbuf[nsend] = malloc(count * sizeof(float));
            fill(sbuf[nsend], s, count, salt_of(s, to, (int)tag), DT_COMM_F32);
            if (dt_comm_send_async(c, sbuf[nsend], count, DT_COMM_F32, to, &sreq[nsend]) != DT_STATUS_OK)
                return call_failed(c, "pipe send", count);
            nsend++;
        }
    }
    for (int i = 0; i < nsend; i++) {
        if (dt_comm_wait(&sreq[i]) != DT_STATUS_OK) return call_failed(c, "pipe send wait", count);
        free(sbuf[i]);
    }
    free(in);
    return rc;
}

Test(comm_p2p, shm_pipeline_1f1b_4_stages) {
    group_t g = group(4, DT_COMM_BACKEND_SHM);
    expect_all_ok(&g, pipeline_1f1b, NULL);
}

Test(comm_p2p, tcp_pipeline_1f1b_4_stages) {
    group_t g = group(4, DT_COMM_BACKEND_TCP);
    expect_all_ok(&g, pipeline_1f1b, NULL);
}

Test(comm_p2p, hier_pipeline_1f1b_across_two_nodes) {
    group_t g = group(4, DT_COMM_BACKEND_HIER);
    g.lws = 2;
    expect_all_ok(&g, pipeline_1f1b, NULL);
}

/* ---- errors ------------------------------------------------------------------------ */

static int expect_err(dt_status_t st, dt_status_t want, const char *const *needles, const char *what) {
    const char *d = dt_error_detail();
    if (st != want) {
        fprintf(stderr, "%s: status %d, expected %d (%s)\n", what, (int)st, (int)want, d);
        return 1;
    }
    for (int i = 0; needles[i]; i++)
        if (!strstr(d, needles[i])) {
            fprintf(stderr, "%s: detail \"%s\" lacks \"%s\"\n", what, d, needles[i]);
            return 1;
        }
    return 0;
}

/* Rank 0 sends 7 f32, rank 1 expects 8; then a second channel (1 -> 0) with
 * f32 against bf16. Both ends fail, naming both counts / dtypes. */
static int mismatch(dt_comm_t *c, const group_t *g, void *arg) {
    (void)g, (void)arg;
    float b[8] = {0};
    int r = dt_comm_rank(c);
    const char *counts[] = {"count 7", "count 8", "rank", NULL};
    const char *types[] = {"f32", "bf16", "send #1", "recv #1", NULL};
    dt_status_t st = r == 0 ? dt_comm_send(c, b, 7, DT_COMM_F32, 1) : dt_comm_recv(c, b, 8, DT_COMM_F32, 0);
    if (expect_err(st, DT_STATUS_MISMATCH, counts, "count mismatch")) return 1;
    st = r == 1 ? dt_comm_send(c, b, 4, DT_COMM_F32, 0) : dt_comm_recv(c, b, 4, DT_COMM_BF16, 1);
    return expect_err(st, DT_STATUS_MISMATCH, types, "dtype mismatch");
}

Test(comm_p2p, shm_count_and_dtype_mismatch_named) {
    group_t g = group(2, DT_COMM_BACKEND_SHM);
    expect_all_ok(&g, mismatch, NULL);
}

Test(comm_p2p, tcp_count_and_dtype_mismatch_named) {
    group_t g = group(2, DT_COMM_BACKEND_TCP);
    expect_all_ok(&g, mismatch, NULL);
}

/* Rank 1 receives message #1 from rank 0, then waits for #2, which rank 0 never
 * sends, and for #1 from rank 2, which never sets up the channel: both time out
 * naming op, peer and number. Rank 0 and 2 stay alive until rank 1 is done. */
static int stalled_peer(dt_comm_t *c, const group_t *g, void *arg) {
    (void)arg;
    int r = dt_comm_rank(c);
    float b[3] = {1, 2, 3};
    char done[128];
    snprintf(done, sizeof(done), "/tmp/%s.p2p-done", g->run_id);
    if (r != 1) { /* alive (not talking) until rank 1 is done: a file, as the comm would time out */
        if (r == 0 && dt_comm_send(c, b, 3, DT_COMM_F32, 1) != DT_STATUS_OK) return call_failed(c, "send", 3);
        for (int i = 0; i < 6000 && access(done, F_OK) != 0; i++) dt_sleep_ms(10);
        return 0;
    }
    if (dt_comm_recv(c, b, 3, DT_COMM_F32, 0) != DT_STATUS_OK) return call_failed(c, "recv #1", 3);
    double t0 = dt_now_s();
    dt_comm_req_t a, z;
    if (dt_comm_recv_async(c, b, 3, DT_COMM_F32, 0, &a) != DT_STATUS_OK) return call_failed(c, "recv_async", 3);
    if (dt_comm_recv_async(c, b, 2, DT_COMM_BF16, 2, &z) != DT_STATUS_OK) return call_failed(c, "recv_async", 2);
    const char *n2[] = {"recv #2 from rank 0 (count 3, f32)", "did not complete", NULL};
    const char *n3[] = {"recv #1 from rank 2 (count 2, bf16)", "rank 2 did not set up", NULL};
    int rc = expect_err(dt_comm_wait(&a), DT_STATUS_TIMEOUT, n2, "stalled channel");
    rc |= expect_err(dt_comm_wait(&z), DT_STATUS_TIMEOUT, n3, "absent peer");
    double took = dt_now_s() - t0;
    if (took > g->timeout_s + 20) {
        fprintf(stderr, "timeouts took %.1f s with timeout %.1f s\n", took, g->timeout_s);
        rc = 1;
    }
    FILE *f = fopen(done, "w");
    if (f) fclose(f);
    return rc;
}

static void expect_timeouts(dt_comm_backend_t b) {
    group_t g = group(3, b);
    g.timeout_s = 2.0;
    char done[128];
    snprintf(done, sizeof(done), "/tmp/%s.p2p-done", g.run_id);
    unlink(done);
    expect_all_ok(&g, stalled_peer, NULL);
    unlink(done);
}

Test(comm_p2p, shm_timeout_names_op_peer_and_sequence) { expect_timeouts(DT_COMM_BACKEND_SHM); }

Test(comm_p2p, tcp_timeout_names_op_peer_and_sequence) { expect_timeouts(DT_COMM_BACKEND_TCP); }

static int bad_peer(dt_comm_t *c, const group_t *g, void *arg) {
    (void)g, (void)arg;
    float b = 0;
    dt_comm_req_t req;
    int r = dt_comm_rank(c);
    const char *n1[] = {"peer 2", "not a rank", NULL}, *n2[] = {"peer -1", NULL}, *n3[] = {"this rank itself", NULL};
    int rc = expect_err(dt_comm_send(c, &b, 1, DT_COMM_F32, 2), DT_STATUS_INVALID, n1, "peer 2");
    rc |= expect_err(dt_comm_recv_async(c, &b, 1, DT_COMM_F32, -1, &req), DT_STATUS_INVALID, n2, "peer -1");
    rc |= expect_err(dt_comm_send_async(c, &b, 1, DT_COMM_F32, r, &req), DT_STATUS_INVALID, n3, "self");
    return rc;
}

Test(comm_p2p, bad_peer_is_invalid) {
    group_t g = group(2, DT_COMM_BACKEND_SHM);
    expect_all_ok(&g, bad_peer, NULL);
}

static const rank_fn_t rank_fns[] = {all_pairs, many_in_flight, ring, pipeline_1f1b, mismatch, stalled_peer, bad_peer};

static int rank_fn_index(rank_fn_t fn) {
    for (int i = 0; i < (int)(sizeof rank_fns / sizeof rank_fns[0]); i++)
        if (rank_fns[i] == fn) return i;
    return -1;
}

static rank_fn_t rank_fn_at(int i) {
    return i >= 0 && i < (int)(sizeof rank_fns / sizeof rank_fns[0]) ? rank_fns[i] : NULL;
}
