/*
 * test_trace.c - the job timeline: the recorder's ring keeps the last N steps in
 * order across wraparound and drops what does not fit a step, records nothing when
 * off; Cristian's offset arithmetic; the merge shifts each rank by its clock offset
 * and names a corrupt or missing rank file.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/trace.h"
#include "runtime/tools/timeline.h"

Test(trace_ring, keeps_the_last_n_steps_in_order) {
    cr_assert_eq(dt_trace_init(3, 0), DT_STATUS_OK);
    for (int64_t s = 1; s <= 10; s++) {
        dt_trace_step_begin(s);
        for (int k = 0; k < 5; k++) dt_trace_span(DT_TRACE_COMPUTE, "forward", (double)s + k * 0.01, (double)s + k * 0.01 + 0.005);
    }
    dt_trace_rec *r;
    size_t n;
    uint64_t dropped;
    cr_assert_eq(dt_trace_collect(&r, &n, &dropped), DT_STATUS_OK);
    cr_assert_eq(n, 15, "the last 3 steps' 5 spans: %zu", n);
    cr_assert_eq(dropped, 0);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(r[i].step, 8 + (int64_t)i / 5, "span %zu in step %lld", i, (long long)r[i].step);
        if (i) cr_assert(r[i].t0_ns > r[i - 1].t0_ns, "oldest first, by start");
        cr_assert_eq(r[i].t1_ns - r[i].t0_ns, 5000000);
    }
    free(r);
    dt_trace_free();
}

Test(trace_ring, a_full_step_drops_and_counts_the_rest) {
    cr_assert_eq(dt_trace_init(2, 1), DT_STATUS_OK);
    for (int k = 0; k < DT_TRACE_SPANS_PER_STEP + 10; k++) dt_trace_span(DT_TRACE_COMM, "dp wait", 1.0, 1.5);
    dt_trace_rec *r;
    size_t n;
    uint64_t dropped;
    cr_assert_eq(dt_trace_collect(&r, &n, &dropped), DT_STATUS_OK);
    cr_assert_eq(n, DT_TRACE_SPANS_PER_STEP);
    cr_assert_eq(dropped, 10);
    free(r);
    /* the bucket reused two steps later: its overflow stays counted */
    dt_trace_step_begin(2);
    dt_trace_step_begin(3);
    cr_assert_eq(dt_trace_collect(&r, &n, &dropped), DT_STATUS_OK);
    cr_assert_eq(n, 0);
    cr_assert_eq(dropped, 10);
    free(r);
    dt_trace_free();
}

Test(trace_ring, off_records_nothing_and_bad_sizes_are_refused) {
    cr_assert_eq(dt_trace_on(), 0);
    dt_trace_span(DT_TRACE_STEP, "step", 1, 2); /* no recorder: nothing, no crash */
    cr_assert_eq(dt_trace_current_step(), -1);
    cr_assert_eq(dt_trace_now(), 0.0);
    cr_assert_eq(dt_trace_init(1, 0), DT_STATUS_INVALID);
    cr_assert_eq(dt_trace_init(DT_TRACE_MAX_STEPS + 1, 0), DT_STATUS_INVALID);
    cr_assert_eq(dt_trace_init(4, 0), DT_STATUS_OK);
    cr_assert_eq(dt_trace_init(4, 0), DT_STATUS_INVALID, "a second recorder");
    dt_trace_free();
    cr_assert_eq(dt_trace_on(), 0);
}

Test(trace_clock, cristian_offset_and_round_trip) {
    int64_t off, rtt;
    /* the server's clock is the client's + 300; 50 each way: sent at 1000 (client),
     * read at 1050 + 300 on the server, received at 1100 */
    dt_trace_cristian(1000, 1350, 1100, &off, &rtt);
    cr_assert_eq(off, 300);
    cr_assert_eq(rtt, 100);
    /* a server behind the client */
    dt_trace_cristian(5000, 4000 + 20, 5040, &off, &rtt);
    cr_assert_eq(off, -1000);
    cr_assert_eq(rtt, 40);
    /* asymmetric paths (10 out, 90 back): the error is within half the round trip */
    dt_trace_cristian(0, 10 + 300, 100, &off, &rtt);
    cr_assert(off >= 300 - rtt / 2 && off <= 300 + rtt / 2, "offset %lld", (long long)off);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
}

static char *tmp_dir(void) {
    static char dir[] = "/tmp/dt-trace-test.XXXXXX";
    cr_assert(mkdtemp(dir));
    char sub[256];
    snprintf(sub, sizeof sub, "%s/trace", dir);
    cr_assert_eq(dt_fs_mkdir_p(sub), DT_STATUS_OK);
    return dir;
}

static const char rank_fmt[] =
    "{\"format\": \"dtrun-trace-rank\", \"version\": 1, \"rank\": %d, \"world_size\": 2, \"host\": \"h%d\", "
    "\"trace_steps\": 20, \"epoch_ns\": \"%s\", \"clock_offset_ns\": %s, \"clock_rtt_ns\": 10, \"dropped\": 0, "
    "\"spans\": [{\"t0\": 0, \"t1\": 4000, \"step\": 1, \"cat\": \"step\", \"name\": \"step\"},"
    " {\"t0\": 1000, \"t1\": 3000, \"step\": 1, \"cat\": \"op\", \"name\": \"all_reduce\", \"queued\": 500, "
    "\"comm\": \"0\", \"seq\": 7, \"count\": 10, \"bytes\": 40, \"dtype\": \"f32\", \"peer\": -1, \"p2p\": false}]}";

Test(trace_merge, shifts_each_rank_by_its_clock_offset) {
    char *dir = tmp_dir(), path[512], text[2048];
    snprintf(path, sizeof path, "%s/trace/rank_0.json", dir);
    snprintf(text, sizeof text, rank_fmt, 0, 0, "1000000000000000000", "0");
    write_text(path, text);
    /* rank 1's clock runs 5 us ahead of rank 0's (offset -5000): its epoch 1000007000 is
     * 1000002000 on rank 0's clock, 2 us after rank 0's */
    snprintf(path, sizeof path, "%s/trace/rank_1.json", dir);
    snprintf(text, sizeof text, rank_fmt, 1, 1, "1000000000000007000", "-5000");
    write_text(path, text);
    dt_timeline tl;
    cr_assert_eq(dt_timeline_from_ranks(dir, &tl), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(tl.n_ranks, 2);
    cr_assert_eq(tl.n, 4);
    cr_assert_str_eq(tl.epoch_ns, "1000000000000000000");
    for (size_t i = 0; i < tl.n; i++) {
        const dt_tl_event *e = &tl.ev[i];
        double want = (e->pid ? 2.0 : 0.0) + (e->cat == DT_TRACE_OP ? 1.0 : 0.0);
        cr_assert_float_eq(e->ts, want, 1e-9, "rank %d %s at %g us", e->pid, e->name, e->ts);
        if (e->cat == DT_TRACE_OP) cr_assert(e->seq == 7 && e->bytes == 40 && e->queued_us == 0.5);
    }
    /* written and read back: the same events */
    snprintf(path, sizeof path, "%s/trace.json", dir);
    cr_assert_eq(dt_timeline_write_json(&tl, path), DT_STATUS_OK);
    dt_timeline back;
    cr_assert_eq(dt_timeline_read_json(path, &back), DT_STATUS_OK, "%s", dt_error_detail());
    cr_assert_eq(back.n, tl.n);
    for (size_t i = 0; i < tl.n; i++) {
        cr_assert_float_eq(back.ev[i].ts, tl.ev[i].ts, 1e-6);
        cr_assert_str_eq(back.ev[i].name, tl.ev[i].name);
        cr_assert_eq(back.ev[i].seq, tl.ev[i].seq);
    }
    cr_assert_str_eq(back.tracks[back.ev[1].tid - 1], "comm 0");
    cr_assert_str_eq(back.hosts[1], "h1");
    int64_t a, b;
    cr_assert_eq(dt_timeline_steps(&back, &a, &b), DT_STATUS_OK);
    cr_assert(a == 1 && b == 1);
    snprintf(path, sizeof path, "%s/t.svg", dir);
    cr_assert_eq(dt_timeline_svg(&back, 2, path), DT_STATUS_NOT_FOUND);
    cr_assert(strstr(dt_error_detail(), "holds steps 1..1"), "%s", dt_error_detail());
    cr_assert_eq(dt_timeline_svg(&back, 1, path), DT_STATUS_OK);
    dt_timeline_free(&back);
    dt_timeline_free(&tl);
    dt_fs_rm_rf(dir);
}

Test(trace_merge, names_a_corrupt_or_missing_rank_file) {
    char *dir = tmp_dir(), path[512], text[2048];
    dt_timeline tl;
    cr_assert_eq(dt_timeline_from_ranks(dir, &tl), DT_STATUS_NOT_FOUND);
    cr_assert(strstr(dt_error_detail(), "rank_0.json: no trace"), "%s", dt_error_detail());
    snprintf(path, sizeof path, "%s/trace/rank_0.json", dir);
    snprintf(text, sizeof text, rank_fmt, 0, 0, "1000", "0");
    write_text(path, text);
    cr_assert_eq(dt_timeline_from_ranks(dir, &tl), DT_STATUS_NOT_FOUND, "rank 1 is missing");
    cr_assert(strstr(dt_error_detail(), "rank_1.json"), "%s", dt_error_detail());
    snprintf(path, sizeof path, "%s/trace/rank_1.json", dir);
    write_text(path, "{\"format\": \"dtrun-trace-rank\", \"rank\": 1, \"spa");
    cr_assert_eq(dt_timeline_from_ranks(dir, &tl), DT_STATUS_FORMAT);
    cr_assert(strstr(dt_error_detail(), "rank_1.json: not JSON"), "%s", dt_error_detail());
    snprintf(text, sizeof text, rank_fmt, 1, 1, "1000", "0");
    char *t1 = strstr(text, "\"t1\": 4000");
    memcpy(t1, "\"t1\": -400", 10); /* a span ending before it starts */
    write_text(path, text);
    cr_assert_eq(dt_timeline_from_ranks(dir, &tl), DT_STATUS_FORMAT);
    cr_assert(strstr(dt_error_detail(), "rank_1.json: span 0"), "%s", dt_error_detail());
    dt_fs_rm_rf(dir);
}
