/*
 * test_comm_faults.c - the communicator when things go wrong, with real rank
 * processes (tests/comm_harness.h): mismatched ops and hangs named, dead peers
 * failing fast, stale shared-memory segments of a killed round removed, bad
 * configuration and arguments as errors, and large messages.
 */
#define _GNU_SOURCE
#include "tests/comm_harness.h"

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
    /* shm: every rank sees the peers' op under the same number, at once (no timeout) */
    if (g->backend == DT_COMM_BACKEND_SHM && st != DT_STATUS_MISMATCH) return 22;
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

Test(comm_shm, mismatched_ops_fail_at_once_naming_both_ops) {
    group_t g = group(3, DT_COMM_BACKEND_SHM);
    g.timeout_s = 30.0; /* the desync is found long before it */
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
    mismatched, hang_in_init_never, one_all_reduce, all_reduce_forever, die_or_reduce, large_ops,
};

static int rank_fn_index(rank_fn_t fn) {
    for (int i = 0; i < (int)(sizeof(rank_fns) / sizeof(rank_fns[0])); i++)
        if (rank_fns[i] == fn) return i;
    return -1;
}

static rank_fn_t rank_fn_at(int i) {
    return i >= 0 && i < (int)(sizeof(rank_fns) / sizeof(rank_fns[0])) ? rank_fns[i] : NULL;
}
