/*
 * test_pp_sched.c - pipeline schedules (runtime/layout/pp_sched.h): every action
 * exactly once, each backward after its forward; the order a rank sends on each link is
 * the order the rank on the other end receives in, per schedule (so messages match);
 * 1F1B and interleaved keep their warm-up bounds; the arenas held at once by hand
 * (GPipe m, 1F1B P - s, plus one receiving ahead); a schedule simulated with unit
 * forward and 2-unit backward times has the formula's bubble; the errors name the key.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/layout/pp_sched.h"

#define MAXA 4096

static int build(dt_pp_schedule_t k, int P, int V, int m, int s, dt_pp_action *a) {
    char msg[256];
    cr_assert_eq(dt_pp_schedule_check(k, P, V, m, msg, sizeof msg), 0, "%s", msg);
    return dt_pp_schedule_build(k, P, V, m, s, a);
}

Test(pp_sched, every_action_once_backward_after_forward) {
    static const int cases[][4] = {{DT_PP_GPIPE, 4, 1, 4}, {DT_PP_GPIPE, 3, 1, 7}, {DT_PP_1F1B, 4, 1, 4},
                                   {DT_PP_1F1B, 4, 1, 9}, {DT_PP_1F1B, 1, 1, 3}, {DT_PP_INTERLEAVED, 2, 2, 4},
                                   {DT_PP_INTERLEAVED, 4, 3, 8}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int k = cases[c][0], P = cases[c][1], V = cases[c][2], m = cases[c][3];
        for (int s = 0; s < P; s++) {
            dt_pp_action a[MAXA];
            int n = build(k, P, V, m, s, a);
            cr_assert_eq(n, 2 * m * V);
            int fpos[64][8], bpos[64][8];
            memset(fpos, -1, sizeof fpos);
            memset(bpos, -1, sizeof bpos);
            for (int i = 0; i < n; i++) {
                int *p = a[i].fwd ? &fpos[a[i].mb][a[i].chunk] : &bpos[a[i].mb][a[i].chunk];
                cr_assert_eq(*p, -1, "case %zu rank %d: action %d repeats", c, s, i);
                *p = i;
            }
            for (int mb = 0; mb < m; mb++)
                for (int ch = 0; ch < V; ch++)
                    cr_assert(fpos[mb][ch] >= 0 && bpos[mb][ch] > fpos[mb][ch], "case %zu rank %d mb %d chunk %d", c,
                              s, mb, ch);
        }
    }
}

/* The sequence of (mb, virtual stage) a rank sends forward to rank (s+1) % P must be
 * the sequence that rank receives, and the same for gradients going back. */
static void check_links(dt_pp_schedule_t k, int P, int V, int m) {
    static dt_pp_action a[8][MAXA];
    int n = 0;
    for (int s = 0; s < P; s++) n = build(k, P, V, m, s, a[s]);
    for (int s = 0; s < P; s++) {
        for (int fwd = 0; fwd < 2; fwd++) {
            int peer = fwd ? (s + 1) % P : (s + P - 1) % P;
            int sent[MAXA][2], ns = 0, got[MAXA][2], ng = 0;
            for (int i = 0; i < n; i++) {
                dt_pp_action *x = &a[s][i];
                if (x->fwd == fwd && dt_pp_action_sends(x, P, V, s)) {
                    sent[ns][0] = x->mb;
                    sent[ns++][1] = x->chunk * P + s + (fwd ? 1 : -1); /* the receiving virtual stage */
                }
                dt_pp_action *y = &a[peer][i];
                if (y->fwd == fwd && dt_pp_action_receives(y, P, V, peer)) {
                    got[ng][0] = y->mb;
                    got[ng++][1] = y->chunk * P + peer;
                }
            }
            cr_assert_eq(ns, ng, "P %d V %d m %d: rank %d sends %d to %d, which receives %d", P, V, m, s, ns, peer, ng);
            for (int i = 0; i < ns; i++)
                cr_assert(sent[i][0] == got[i][0] && sent[i][1] == got[i][1],
                          "P %d V %d m %d: message %d from rank %d (%s): sent mb %d stage %d, received mb %d stage %d",
                          P, V, m, i, s, fwd ? "forward" : "backward", sent[i][0], sent[i][1], got[i][0], got[i][1]);
        }
    }
}

Test(pp_sched, links_match) {
    check_links(DT_PP_GPIPE, 4, 1, 5);
    check_links(DT_PP_1F1B, 4, 1, 4);
    check_links(DT_PP_1F1B, 3, 1, 8);
    check_links(DT_PP_INTERLEAVED, 2, 2, 4);
    check_links(DT_PP_INTERLEAVED, 4, 2, 8);
    check_links(DT_PP_INTERLEAVED, 3, 3, 6);
}

Test(pp_sched, arenas_by_hand) {
    /* gpipe: all m forwards before any backward */
    for (int s = 0; s < 4; s++) cr_assert_eq(dt_pp_arenas(DT_PP_GPIPE, 4, 1, 16, s), 16);
    /* 1f1b: P - s in flight; a rank that receives its input takes one more ahead (capped at m) */
    cr_assert_eq(dt_pp_arenas(DT_PP_1F1B, 4, 1, 16, 0), 4);
    cr_assert_eq(dt_pp_arenas(DT_PP_1F1B, 4, 1, 16, 1), 4);
    cr_assert_eq(dt_pp_arenas(DT_PP_1F1B, 4, 1, 16, 2), 3);
    cr_assert_eq(dt_pp_arenas(DT_PP_1F1B, 4, 1, 16, 3), 2);
    cr_assert_eq(dt_pp_arenas(DT_PP_1F1B, 1, 1, 5, 0), 1); /* no pipeline: forward, backward */
    /* the first stage holds the most under 1f1b; gpipe's m exceeds it */
    for (int s = 1; s < 4; s++)
        cr_assert_leq(dt_pp_arenas(DT_PP_1F1B, 4, 1, 8, s), dt_pp_arenas(DT_PP_1F1B, 4, 1, 8, 0));
    /* interleaved P 2, V 2, m 4, rank 0: warm-up (2-0-1)*2 + (2-1)*2 = 4 forwards (its
     * chunk-0 forwards of mb 0,1 and chunk-1 forwards of mb 0,1, the latter received) */
    cr_assert_eq(dt_pp_arenas(DT_PP_INTERLEAVED, 2, 2, 4, 0), 6);
}

/* Simulates the schedule: forward 1 unit, backward 2 units, a message arrives when sent
 * (no transfer time); returns the mean over ranks of idle time / span. */
static double simulated_bubble(dt_pp_schedule_t k, int P, int V, int m) {
    static dt_pp_action a[8][MAXA];
    int n = 0, pos[8] = {0};
    for (int s = 0; s < P; s++) n = build(k, P, V, m, s, a[s]);
    double t[8] = {0}, busy[8] = {0};
    static double fdone[8][64][8], bdone[8][64][8];
    for (int s = 0; s < P; s++)
        for (int i = 0; i < 64; i++)
            for (int c = 0; c < 8; c++) fdone[s][i][c] = bdone[s][i][c] = -1;
    for (int progress = 1; progress;) {
        progress = 0;
        for (int s = 0; s < P; s++) {
            if (pos[s] == n) continue;
            dt_pp_action *x = &a[s][pos[s]];
            int vs = x->chunk * P + s;
            double ready = 0;
            if (dt_pp_action_receives(x, P, V, s)) {
                int ps = x->fwd ? (vs - 1) % P : (vs + 1) % P, pc = x->fwd ? (vs - 1) / P : (vs + 1) / P;
                ready = x->fwd ? fdone[ps][x->mb][pc] : bdone[ps][x->mb][pc];
                if (ready < 0) continue; /* not sent yet */
            }
            double dur = x->fwd ? 1 : 2, start = t[s] > ready ? t[s] : ready;
            t[s] = start + dur;
            busy[s] += dur;
            (x->fwd ? fdone : bdone)[s][x->mb][x->chunk] = t[s];
            pos[s]++;
            progress = 1;
        }
    }
    double span = 0, idle = 0;
    for (int s = 0; s < P; s++) {
        cr_assert_eq(pos[s], n, "the schedule deadlocks at rank %d action %d", s, pos[s]);
        if (t[s] > span) span = t[s];
    }
    for (int s = 0; s < P; s++) idle += (span - busy[s]) / span;
    return idle / P;
}

Test(pp_sched, simulated_bubble_is_the_formula) {
    static const int cases[][4] = {{DT_PP_GPIPE, 4, 1, 4},  {DT_PP_GPIPE, 4, 1, 16}, {DT_PP_1F1B, 4, 1, 4},
                                   {DT_PP_1F1B, 4, 1, 16},  {DT_PP_1F1B, 2, 1, 8},   {DT_PP_INTERLEAVED, 4, 2, 8},
                                   {DT_PP_INTERLEAVED, 2, 4, 4}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int k = cases[c][0], P = cases[c][1], V = cases[c][2], m = cases[c][3];
        double got = simulated_bubble(k, P, V, m), want = dt_pp_bubble_ideal(k, P, V, m);
        cr_assert(got > want - 1e-9 && got < want + 1e-9, "%s P %d V %d m %d: simulated %.4f, formula %.4f",
                  dt_pp_schedule_name(k), P, V, m, got, want);
    }
}

Test(pp_sched, errors_name_the_key) {
    char msg[256];
    cr_assert_eq(dt_pp_schedule_check(DT_PP_1F1B, 4, 1, 3, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "gradient_accumulation_steps") && strstr(msg, "gpipe"), "%s", msg);
    cr_assert_eq(dt_pp_schedule_check(DT_PP_INTERLEAVED, 4, 1, 8, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "pipeline.virtual_stages"), "%s", msg);
    cr_assert_eq(dt_pp_schedule_check(DT_PP_INTERLEAVED, 4, 2, 6, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "multiple of pipeline.stages"), "%s", msg);
    cr_assert_eq(dt_pp_schedule_check(DT_PP_GPIPE, 4, 2, 8, msg, sizeof msg), 1);
    cr_assert(strstr(msg, "interleaved"), "%s", msg);
    cr_assert_eq(dt_pp_schedule_parse("1f1b"), DT_PP_1F1B);
    cr_assert_eq(dt_pp_schedule_parse("pipedream"), -1);
}
