/*
 * test_flight.c - the flight recorder: the ring keeps the newest entries in
 * order across wraparound, ignores updates of reused slots, drops torn entries
 * (a writer inside one, also under a concurrent writer), refuses a bad header;
 * the analyser names the rank that never entered the op the others wait in,
 * a desynced rank, and nobody when no rank waits or the late rank ended.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/flight_ring.h"
#include "runtime/launch/flight_report.h"

static dt_flight_ring_t *new_ring(uint32_t slots, size_t *len) {
    *len = dt_flight_ring_bytes(slots);
    dt_flight_ring_t *r = calloc(1, *len);
    dt_flight_ring_init(r, slots, 3, 1234);
    return r;
}

Test(flight_ring, wraparound_keeps_the_newest_in_order) {
    size_t len;
    dt_flight_ring_t *r = new_ring(8, &len);
    uint64_t ids[20];
    for (int i = 0; i < 20; i++) ids[i] = dt_flight_ring_add(r, "0", "all_reduce", "f32", (uint64_t)i + 1, 10, -1);
    dt_flight_ring_set_state(r, ids[19], DT_FLIGHT_STARTED);
    dt_flight_ring_set_state(r, ids[19], DT_FLIGHT_DONE);
    dt_flight_ring_set_state(r, ids[3], DT_FLIGHT_FAILED); /* slot reused by id 12: ignored */
    dt_flight_entry_t out[8];
    int n = 0, torn = 0;
    cr_assert_eq(dt_flight_ring_snapshot(r, len, out, &n, &torn), DT_STATUS_OK);
    cr_assert_eq(n, 8);
    cr_assert_eq(torn, 0);
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(out[i].id, (uint64_t)(13 + i));
        cr_assert_eq(out[i].seq, (uint64_t)(13 + i));
    }
    cr_assert_eq(out[3].state, DT_FLIGHT_QUEUED, "id 16 (slot of id 4) keeps its state");
    cr_assert_eq(out[7].state, DT_FLIGHT_DONE);
    cr_assert(out[7].t_end_ns >= out[7].t_start_ns && out[7].t_start_ns >= out[7].t_enqueue_ns);
    cr_assert_str_eq(out[0].op, "all_reduce");
    free(r);
}

Test(flight_ring, torn_entry_is_dropped) {
    size_t len;
    dt_flight_ring_t *r = new_ring(4, &len);
    for (int i = 0; i < 3; i++) dt_flight_ring_add(r, "0", "barrier", "f32", (uint64_t)i + 1, 0, -1);
    atomic_fetch_add(&r->e[1].gen, 1); /* a writer stopped inside entry 2 */
    dt_flight_entry_t out[4];
    int n = 0, torn = 0;
    cr_assert_eq(dt_flight_ring_snapshot(r, len, out, &n, &torn), DT_STATUS_OK);
    cr_assert_eq(n, 2);
    cr_assert_eq(torn, 1);
    cr_assert_eq(out[0].seq, 1);
    cr_assert_eq(out[1].seq, 3);
    free(r);
}

Test(flight_ring, bad_header_is_refused) {
    size_t len;
    dt_flight_ring_t *r = new_ring(4, &len);
    dt_flight_entry_t out[4];
    int n, torn;
    cr_assert_eq(dt_flight_ring_snapshot(r, len - 1, out, &n, &torn), DT_STATUS_FORMAT);
    r->magic = 7;
    cr_assert_eq(dt_flight_ring_snapshot(r, len, out, &n, &torn), DT_STATUS_FORMAT);
    free(r);
}

/* A writer hammering a small ring while the reader snapshots: every entry read
 * is whole (its fields agree with each other). */
typedef struct hammer {
    dt_flight_ring_t *r;
    _Atomic int stop;
} hammer_t;

static void *writer(void *arg) {
    hammer_t *h = arg;
    for (uint64_t s = 1; !atomic_load(&h->stop); s++) {
        char comm[16];
        snprintf(comm, sizeof comm, "c%llu", (unsigned long long)(s % 1000));
        uint64_t id = dt_flight_ring_add(h->r, comm, s & 1 ? "all_gather" : "all_reduce", "f32", s, s * 3, -1);
        dt_flight_ring_set_state(h->r, id, DT_FLIGHT_DONE);
        /* a breath now and then, so that some snapshots fall between writes even
         * when both threads share one loaded core (else every read may be torn) */
        if ((s & 63) == 0) usleep(20);
    }
    return NULL;
}

/* A ring file whose next counter is garbage (2^64 - 1): the snapshot reads at
 * most nslots entries and ends (it wrapped its id to 0 and ran on, writing past out). */
Test(flight_ring, corrupted_next_ends, .timeout = 10) {
    size_t len;
    dt_flight_ring_t *r = new_ring(8, &len);
    atomic_store(&r->next, UINT64_MAX);
    dt_flight_entry_t out[8];
    int n = -1, torn = -1;
    cr_assert_eq(dt_flight_ring_snapshot(r, len, out, &n, &torn), DT_STATUS_OK);
    cr_assert_eq(n, 0);
    cr_assert_eq(torn, 0);
    free(r);
}

Test(flight_ring, concurrent_reads_are_whole) {
    size_t len;
    hammer_t h = {.r = new_ring(4, &len)};
    pthread_t t;
    pthread_create(&t, NULL, writer, &h);
    dt_flight_entry_t out[4];
    long seen = 0;
    /* the writer thread may not have run yet on a loaded machine: start reading once
     * it has written (at most 10 s) */
    for (int k = 0, n = 0, torn = 0; k < 100000 && n == 0; k++) {
        cr_assert_eq(dt_flight_ring_snapshot(h.r, len, out, &n, &torn), DT_STATUS_OK);
        if (n == 0) usleep(100);
    }
    for (int k = 0; k < 200000; k++) {
        int n = 0, torn = 0;
        cr_assert_eq(dt_flight_ring_snapshot(h.r, len, out, &n, &torn), DT_STATUS_OK);
        for (int i = 0; i < n; i++) {
            char comm[16];
            snprintf(comm, sizeof comm, "c%llu", (unsigned long long)(out[i].seq % 1000));
            cr_assert_eq(out[i].count, out[i].seq * 3);
            cr_assert_str_eq(out[i].comm, comm);
            cr_assert_str_eq(out[i].op, out[i].seq & 1 ? "all_gather" : "all_reduce");
            seen++;
        }
    }
    atomic_store(&h.stop, 1);
    pthread_join(t, NULL);
    cr_assert_gt(seen, 0);
    free(h.r);
}

/* rank r's last op in communicator "0" */
static void set_rank(dt_flight_rank_t *r, int rank, const char *proc, uint64_t seq, const char *op, uint64_t count,
                     int state) {
    memset(r, 0, sizeof *r);
    r->rank = rank;
    snprintf(r->proc, sizeof r->proc, "%s", proc);
    r->nlast = 1;
    snprintf(r->last[0].comm, sizeof r->last[0].comm, "0");
    snprintf(r->last[0].op, sizeof r->last[0].op, "%s", op);
    snprintf(r->last[0].dtype, sizeof r->last[0].dtype, "f32");
    r->last[0].seq = seq;
    r->last[0].count = count;
    r->last[0].state = state;
}

Test(flight_analyse, names_the_rank_that_never_entered) {
    dt_flight_rank_t rs[3];
    set_rank(&rs[0], 0, "exited 3", 57, "all_reduce", 100, DT_FLIGHT_FAILED);
    set_rank(&rs[1], 1, "stopped (SIGSTOP)", 56, "all_reduce", 100, DT_FLIGHT_DONE);
    set_rank(&rs[2], 2, "sleeping", 57, "all_reduce", 100, DT_FLIGHT_STARTED);
    char msg[1024];
    int c[4];
    cr_assert_eq(dt_flight_analyse(rs, 3, msg, sizeof msg, c, 4), 1, "%s", msg);
    cr_assert_eq(c[0], 1);
    cr_assert(strstr(msg, "ranks 0,2 wait in all_reduce #57 (count 100, f32)"), "%s", msg);
    cr_assert(strstr(msg, "rank 1 never entered it (last in all_reduce #56 (count 100, f32), completed; "
                          "process stopped (SIGSTOP))"), "%s", msg);
    /* the JSON line the agents post carries the same */
    dt_flight_rank_t back[3];
    for (int i = 0; i < 3; i++) {
        char *line = dt_flight_rank_json(&rs[i]);
        cr_assert_eq(dt_flight_rank_parse(line, &back[i]), 0);
        free(line);
    }
    char msg2[1024];
    cr_assert_eq(dt_flight_analyse(back, 3, msg2, sizeof msg2, c, 4), 1);
    cr_assert_str_eq(msg, msg2);
}

Test(flight_analyse, names_a_desync) {
    dt_flight_rank_t rs[3];
    set_rank(&rs[0], 0, "sleeping", 29, "all_reduce", 1732, DT_FLIGHT_STARTED);
    set_rank(&rs[1], 1, "sleeping", 29, "all_gather", 2, DT_FLIGHT_STARTED);
    set_rank(&rs[2], 2, "sleeping", 29, "all_reduce", 1732, DT_FLIGHT_STARTED);
    char msg[1024];
    int c[4];
    cr_assert_eq(dt_flight_analyse(rs, 3, msg, sizeof msg, c, 4), 1, "%s", msg);
    cr_assert_eq(c[0], 1);
    cr_assert(strstr(msg, "desync at #29: rank 1 in all_gather #29 (count 2, f32); the others (ranks 0,2) in "
                          "all_reduce #29 (count 1732, f32)"), "%s", msg);
}

Test(flight_analyse, nobody_when_none_waits_or_the_late_rank_ended) {
    dt_flight_rank_t rs[2];
    char msg[256];
    int c[4];
    set_rank(&rs[0], 0, "sleeping", 9, "all_reduce", 4, DT_FLIGHT_DONE);
    set_rank(&rs[1], 1, "sleeping", 9, "all_reduce", 4, DT_FLIGHT_DONE);
    cr_assert_eq(dt_flight_analyse(rs, 2, msg, sizeof msg, c, 4), 0);
    cr_assert_str_eq(msg, "");
    set_rank(&rs[0], 0, "sleeping", 10, "all_reduce", 4, DT_FLIGHT_STARTED);
    set_rank(&rs[1], 1, "exited 1", 9, "all_reduce", 4, DT_FLIGHT_DONE);
    cr_assert_eq(dt_flight_analyse(rs, 2, msg, sizeof msg, c, 4), 0, "%s", msg);
}

/* A rank that exited 0 while the others wait in an op it never entered left early
 * (it skipped ops): it is named, with how it ended. */
Test(flight_analyse, a_rank_that_exited_0_early_is_named) {
    dt_flight_rank_t rs[2];
    char msg[512];
    int c[4];
    set_rank(&rs[0], 0, "sleeping", 10, "all_gather", 2, DT_FLIGHT_STARTED);
    set_rank(&rs[1], 1, "exited 0", 9, "all_gather", 2, DT_FLIGHT_DONE);
    cr_assert_eq(dt_flight_analyse(rs, 2, msg, sizeof msg, c, 4), 1, "%s", msg);
    cr_assert_eq(c[0], 1);
    cr_assert(strstr(msg, "rank 1 never entered it (last in all_gather #9 (count 2, f32), completed; process exited 0)"),
              "%s", msg);
}

Test(flight_analyse, newest_op_per_communicator) {
    dt_flight_entry_t e[3];
    memset(e, 0, sizeof e);
    const char *comms[] = {"0", "0.s1.0", "0"};
    for (int i = 0; i < 3; i++) {
        snprintf(e[i].comm, sizeof e[i].comm, "%s", comms[i]);
        snprintf(e[i].op, sizeof e[i].op, "broadcast");
        e[i].seq = (uint64_t)i + 1;
        e[i].state = DT_FLIGHT_DONE;
    }
    dt_flight_rank_t r;
    memset(&r, 0, sizeof r);
    dt_flight_rank_from_entries(&r, e, 3);
    cr_assert_eq(r.nlast, 2);
    cr_assert_str_eq(r.last[0].comm, "0");
    cr_assert_eq(r.last[0].seq, 3);
    cr_assert_eq(r.last[1].seq, 2);
}

/* Every rank entered the op but one was stopped inside it (SIGSTOP): that one is
 * named, the others wait for it. */
Test(flight_analyse, a_rank_stopped_inside_the_op_is_named) {
    dt_flight_rank_t rs[3];
    char msg[512];
    int c[4];
    set_rank(&rs[0], 0, "sleeping", 12, "all_reduce", 7, DT_FLIGHT_STARTED);
    set_rank(&rs[1], 1, "stopped (SIGSTOP)", 12, "all_reduce", 7, DT_FLIGHT_STARTED);
    set_rank(&rs[2], 2, "running", 12, "all_reduce", 7, DT_FLIGHT_STARTED);
    cr_assert_eq(dt_flight_analyse(rs, 3, msg, sizeof msg, c, 4), 1, "%s", msg);
    cr_assert_eq(c[0], 1);
    cr_assert(strstr(msg, "rank 1, which entered it but its process is stopped (SIGSTOP)"), "%s", msg);
    cr_assert(strstr(msg, "communicator 0: ranks 0,2 wait in all_reduce #12 "), "%s", msg); /* who waits */
    /* nobody stopped: nothing to name */
    set_rank(&rs[1], 1, "sleeping", 12, "all_reduce", 7, DT_FLIGHT_STARTED);
    cr_assert_eq(dt_flight_analyse(rs, 3, msg, sizeof msg, c, 4), 0, "%s", msg);
}

/* A record from the store with numbers out of range (another agent's, or anyone's
 * without a token) is clamped, not cast (UB). */
Test(flight_analyse, a_garbage_record_is_clamped) {
    dt_flight_rank_t r;
    cr_assert_eq(dt_flight_rank_parse("{\"rank\": 1e300, \"pid\": -5, \"last\": [{\"comm\": \"0\", \"seq\": 1e300, "
                                      "\"count\": -1, \"state\": 1e9}]}",
                                      &r),
                 0);
    cr_assert_eq(r.rank, 1 << 30);
    cr_assert_eq(r.pid, 0);
    cr_assert_eq(r.nlast, 1);
    cr_assert(r.last[0].seq <= (uint64_t)9e15);
    cr_assert_eq(r.last[0].count, 0);
    cr_assert_eq(r.last[0].state, 16);
}

/* rank r's last op in one more communicator */
static void add_last(dt_flight_rank_t *r, const char *comm, uint64_t seq, int state) {
    dt_flight_last_t *l = &r->last[r->nlast++];
    memset(l, 0, sizeof *l);
    snprintf(l->comm, sizeof l->comm, "%s", comm);
    snprintf(l->op, sizeof l->op, "all_gather");
    snprintf(l->dtype, sizeof l->dtype, "f32");
    l->seq = seq;
    l->count = 4;
    l->state = state;
}

/* A hierarchical op on 2 nodes x 2 ranks with rank 3 stopped: rank 2 waits for it
 * in its node's stage ("0.node1"), so it never enters the cross-node stage rank 0
 * waits in ("0.lr0"). Both are findings, but rank 2 waits for rank 3: the only
 * cause named is rank 3. */
Test(flight_analyse, a_rank_waiting_for_a_named_rank_is_not_a_cause) {
    dt_flight_rank_t rs[4];
    char msg[1024];
    int c[4];
    set_rank(&rs[0], 0, "sleeping", 9, "all_gather", 2, DT_FLIGHT_STARTED);
    add_last(&rs[0], "0.lr0", 20, DT_FLIGHT_STARTED);
    set_rank(&rs[1], 1, "sleeping", 9, "all_gather", 2, DT_FLIGHT_STARTED);
    add_last(&rs[1], "0.lr1", 20, DT_FLIGHT_STARTED);
    set_rank(&rs[2], 2, "sleeping", 9, "all_gather", 2, DT_FLIGHT_STARTED);
    add_last(&rs[2], "0.lr0", 19, DT_FLIGHT_DONE);
    add_last(&rs[2], "0.node1", 31, DT_FLIGHT_STARTED);
    set_rank(&rs[3], 3, "stopped (SIGSTOP)", 8, "all_gather", 2, DT_FLIGHT_DONE);
    add_last(&rs[3], "0.lr1", 19, DT_FLIGHT_DONE);
    add_last(&rs[3], "0.node1", 30, DT_FLIGHT_DONE);
    cr_assert_eq(dt_flight_analyse(rs, 4, msg, sizeof msg, c, 4), 1, "%s", msg);
    cr_assert_eq(c[0], 3, "%s", msg);
    /* the finding about rank 2 is still printed */
    cr_assert(strstr(msg, "communicator 0.lr0: rank 0 waits in all_gather #20 (count 4, f32); rank 2 never entered it"),
              "%s", msg);
    /* a cycle (each named rank waits for another): both stay named */
    set_rank(&rs[3], 3, "sleeping", 9, "all_gather", 2, DT_FLIGHT_STARTED);
    add_last(&rs[3], "0.lr1", 19, DT_FLIGHT_DONE);
    add_last(&rs[3], "0.node1", 30, DT_FLIGHT_DONE);
    add_last(&rs[3], "0.x", 5, DT_FLIGHT_STARTED);
    add_last(&rs[2], "0.x", 4, DT_FLIGHT_DONE);
    int nc = dt_flight_analyse(rs, 4, msg, sizeof msg, c, 4);
    cr_assert_eq(nc, 2, "%s", msg);
}
